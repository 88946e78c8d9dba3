"""fp8 with HPUDeepSpeedStrategy on one emulated Gaudi2; run by tests/core/test_deepspeed_fp8.py as a subprocess
(DeepSpeed initialises torch.distributed, which must not leak into the test process).

Usage: python ds_fp8.py train STAGE       bf16 then fp8 fits of the same model, data and seed; prints a JSON report
       python ds_fp8.py measure DIR       saves weights and fp32 outputs, measures while predicting through DeepSpeed
       python ds_fp8.py quantize DIR      (a new process) quantizes from those measurements, predicts, compares
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import lightning as L
import torch

import hpu_nb  # noqa: F401  (registers "hpu" with Lightning)
from hpu_nb import HPUDeepSpeedPrecisionPlugin, HPUDeepSpeedStrategy
from hpu_nb.core.fp8 import DelayedScaling
from hpu_nb.emulator.fp8.engine import Fp8QuantLinear
from hpu_nb.emulator.fp8.training import Fp8Linear
from tests.core.test_deepspeed_fp8 import EPOCHS, MLP, make_regressor, predict_data, train_data
from tests.helpers.models import quiet_trainer_kwargs


def fit(stage: int, precision: str) -> dict:
    L.seed_everything(0, verbose=False)
    model = MLP()
    plugin = HPUDeepSpeedPrecisionPlugin(precision)
    if precision == "fp8":
        plugin.convert_modules(model, replace_layers=True, recipe=DelayedScaling())
    trainer = L.Trainer(accelerator="hpu", devices=1, strategy=HPUDeepSpeedStrategy(stage=stage), plugins=[plugin],
                        **quiet_trainer_kwargs(max_epochs=EPOCHS))
    trainer.fit(model, train_data())
    return {
        "losses": model.losses,
        "first": statistics.mean(model.losses[:16]),
        "final": statistics.mean(model.losses[-16:]),
        "fp8_layers": sorted(n for n, m in model.named_modules() if isinstance(m, Fp8Linear)),
        "fp8_steps": sorted({int(m.steps) for m in model.modules() if isinstance(m, Fp8Linear)}),
        "fp8_scale_dtypes": sorted({str(m.scale.dtype) for m in model.modules() if isinstance(m, Fp8Linear)}),
        "linear_layers": sorted(n for n, m in model.named_modules() if type(m) is torch.nn.Linear),
        "out_dtypes": sorted(str(d) for d in model.out_dtypes),
        "param_dtypes": sorted({str(p.dtype) for p in trainer.strategy.model.parameters()}),
        "bf16_config": trainer.strategy.config.get("bf16"),
        "global_step": trainer.global_step,
    }


def inference(step: str, out: Path) -> dict:
    model = make_regressor()
    if step == "measure":
        torch.save(model.state_dict(), out / "model.pt")
        with torch.no_grad():
            torch.save(torch.cat([model(x) for (x,) in predict_data()]), out / "fp32.pt")
    else:
        model.load_state_dict(torch.load(out / "model.pt"))
    plugin = HPUDeepSpeedPrecisionPlugin("fp8")
    converted = plugin.convert_modules(model, inference=True, quant=step == "quantize", fp8_data_path=str(out / "fp8"))
    assert converted is model
    trainer = L.Trainer(accelerator="hpu", devices=1, strategy=HPUDeepSpeedStrategy(), plugins=[plugin],
                        **quiet_trainer_kwargs())
    preds = torch.cat(trainer.predict(model, predict_data())).float().cpu()
    report = {"engine": type(trainer.strategy.model).__name__,
              "bf16_config": trainer.strategy.config.get("bf16"),
              "quantized": sorted(n for n, m in model.named_modules() if isinstance(m, Fp8QuantLinear))}
    if step == "quantize":
        ref = torch.load(out / "fp32.pt")
        report["relative_error"] = ((preds - ref).norm() / ref.norm()).item()
    return report


def main() -> int:
    step, arg = sys.argv[1], sys.argv[2]
    if step == "train":
        report = {precision: fit(int(arg), precision) for precision in ("bf16-mixed", "fp8")}
    else:
        out = Path(arg)
        out.mkdir(parents=True, exist_ok=True)
        report = inference(step, out)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
