"""fp8 inference on 2 cards with Lightning's script launcher; run by tests/core/test_fp8_inference.py as a subprocess.

Usage: python fp8_predict.py measure|quantize DIR. `measure` saves the weights and measures while predicting;
`quantize` (a new run) quantizes from those measurements and writes DIR/quantized<rank>.json per rank.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import lightning as L
import torch

import hpu_nb  # noqa: F401
from hpu_nb import HPUPrecisionPlugin
from hpu_nb.emulator.fp8.engine import Fp8QuantLinear
from tests.core.test_fp8_inference import data, make_model


def main() -> int:
    step, out = sys.argv[1], Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    model = make_model()
    if step == "measure":
        if "LOCAL_RANK" not in os.environ:  # the launching process (rank 0)
            torch.save(model.state_dict(), out / "model.pt")
    else:
        model.load_state_dict(torch.load(out / "model.pt"))
    reference = make_model()
    reference.load_state_dict(model.state_dict())
    plugin = HPUPrecisionPlugin("fp8")
    model = plugin.convert_modules(model, inference=True, quant=step == "quantize", fp8_data_path=str(out / "fp8"))
    trainer = L.Trainer(accelerator="hpu", devices=2, plugins=[plugin], logger=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.predict(model, data())
    if step == "quantize":
        x = next(iter(data()))[0]
        with torch.no_grad():
            got, want = model.cpu()(x).float(), reference(x)
        report = {"quantized": sorted(n for n, m in model.named_modules() if isinstance(m, Fp8QuantLinear)),
                  "relative_error": ((got - want).norm() / want.norm()).item()}
        (out / f"quantized{trainer.global_rank}.json").write_text(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
