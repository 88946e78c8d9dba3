"""Every combination TrainerConfigWidget allows, and a runner that trains each one with the generated code.

`combinations()` is the widget's whole choice space (strategy with each ZeRO stage and offload, device count,
precision with each autocast style and op lists, accelerator form, profiler, memory chart). The runner executes,
for each valid one, `cfg.code` in a fresh namespace holding a small `model`, then `trainer.fit` for two steps
(`trainer.predict` for fp8 inference), and writes one JSON line per combination.

The slow combinations are grouped: the runner is started once per (device count, execution mode) under
`torch.distributed.run`, so a group's ranks set up their process group once and every multi-device Trainer joins it
(as with torchrun) instead of launching new processes per combination. Combinations whose generated programs are the
same (they differ only in comments, e.g. the autocast style's snippet) run once. For DeepSpeed and FSDP (about a
second per Trainer) the three orthogonal choices — accelerator form, profiler, memory chart — run in two forms, all
off and all on; the fast strategies run all eight.
Usage: python -m torch.distributed.run --nproc_per_node N tests/helpers/trainer_config_runs.py --out FILE --fp8 DIR
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import logging
import os
import sys
import time
import traceback
import warnings
import zlib
from collections.abc import Iterator
from pathlib import Path

STRATEGY_VARIANTS = [("auto", 2, False), ("single", 2, False), ("parallel", 2, False), ("ddp", 2, False),
                     ("fsdp", 2, False)] + [("deepspeed", s, o) for s in (0, 1, 2, 3) for o in (False, True)]
PRECISION_VARIANTS = [
    ("32-true", "plugin", None, None), ("32-true", "context", None, None),
    ("bf16-mixed", "plugin", None, None), ("bf16-mixed", "context", None, None),
    ("bf16-mixed", "decorator", None, None), ("bf16-mixed", "plugin", ["linear", "matmul"], ["softmax"]),
    ("16-mixed", "plugin", None, None), ("16-mixed", "context", None, None), ("16-mixed", "decorator", None, None),
    ("16-mixed", "plugin", ["linear"], ["sum"]),
    ("fp8", "plugin", None, None), ("fp8-measure", "plugin", None, None), ("fp8-quantize", "plugin", None, None),
]
FEATURES = 32
QUIET = {"logger": False, "enable_checkpointing": False, "enable_progress_bar": False, "enable_model_summary": False}
RUN = {**QUIET, "max_steps": 2, "limit_predict_batches": 2}


def combinations(devices: tuple[int, ...] = (1, 2), fp8_data_path: str = "fp8_data", extra: dict | None = None
                 ) -> Iterator[dict]:
    """The field values of every combination (valid or not)."""
    for (strategy, stage, offload), (precision, autocast, lower, fp32), n, accelerator, profiler, monitor in \
            itertools.product(STRATEGY_VARIANTS, PRECISION_VARIANTS, devices, ("hpu", "HPUAccelerator()"),
                              (False, True), (False, True)):
        yield dict(accelerator=accelerator, devices=n, strategy=strategy, deepspeed_stage=stage,
                   offload_optimizer=offload, precision=precision, autocast=autocast, lower_list=lower,
                   fp32_list=fp32, fp8_data_path=fp8_data_path, profiler=profiler, monitor=monitor,
                   extra=dict(extra or RUN))


TWO_FORMS = {("hpu", False, False), ("HPUAccelerator()", True, True)}


def selected(values: Iterator[dict], strategies: set[str], forms: str) -> Iterator[dict]:
    """The valid combinations of the strategies named; with forms="two", the orthogonal choices all off or all on."""
    from hpu_nb.notebook.trainer_config import TrainerConfig

    for v in values:
        if strategies and v["strategy"] not in strategies:
            continue
        if forms == "two" and (v["accelerator"], v["profiler"], v["monitor"]) not in TWO_FORMS:
            continue
        if not TrainerConfig(**v).errors:
            yield v


def key(values: dict) -> str:
    return json.dumps({k: v for k, v in values.items() if k not in ("extra", "fp8_data_path")}, sort_keys=True)


def run_one(values: dict, workdir: Path, fp8_measured: str) -> dict:
    """Execute the generated code of one combination and train (or predict) with it."""
    from hpu_nb.notebook.trainer_config import TrainerConfig
    from tests.helpers.models import LinearModel, regression_data

    if values["precision"] == "fp8-measure":
        values = dict(values, fp8_data_path=str(workdir / f"measure-{zlib.crc32(key(values).encode())}"))
    elif values["precision"] == "fp8-quantize":
        values = dict(values, fp8_data_path=fp8_measured)
    cfg = TrainerConfig(**values)
    namespace = {"model": LinearModel(FEATURES)} if cfg.needs_model else {}
    exec(cfg.code, namespace)
    trainer = namespace["trainer"]
    model = namespace.get("model", LinearModel(FEATURES))
    if cfg.offloads:  # the user pasted the code's snippet: configure_optimizers returns DeepSpeedCPUAdam
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        model.configure_optimizers = lambda: DeepSpeedCPUAdam(model.parameters(), lr=cfg.offload_lr)
    data = regression_data(n=32, features=FEATURES)
    if cfg.precision in ("fp8-measure", "fp8-quantize"):
        out = trainer.predict(model, data)
        return {"ok": bool(out) and all(o.isfinite().all() for o in out), "predicted": len(out)}
    trainer.fit(model, data)
    return {"ok": trainer.global_step == 2, "global_step": trainer.global_step}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--fp8", required=True, help="measurements of LinearModel(32) for the quantize combinations")
    parser.add_argument("--only", default="", help="run only the strategies named (comma-separated)")
    parser.add_argument("--forms", default="all", choices=("all", "two"),
                        help="the orthogonal choices (accelerator form, profiler, monitor): all 8, or all off / all on")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    warnings.filterwarnings("ignore")
    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "DeepSpeed", "deepspeed"):
        logging.getLogger(name).setLevel(logging.ERROR)
    from hpu_nb.notebook.trainer_config import TrainerConfig
    from tests.helpers.cpu_info_once import ask_cpu_info_once

    ask_cpu_info_once()
    rank = int(os.environ.get("RANK", "0"))
    devices = int(os.environ.get("WORLD_SIZE", "1"))
    workdir = Path(args.out).parent / f"work-{devices}"
    workdir.mkdir(parents=True, exist_ok=True)
    os.chdir(workdir)  # profiler traces and fp8 measurements land here
    only = set(filter(None, args.only.split(",")))
    results = []
    done: dict[str, dict] = {}  # program (code without comments) -> its result: the same program runs once
    for values in selected(combinations((devices,)), only, args.forms):
        cfg = TrainerConfig(**values)
        program = "\n".join(line for line in cfg.code.splitlines() if not line.lstrip().startswith("#"))
        if program in done:
            results.append(dict(done[program], key=key(values), same_program_as=done[program]["key"], seconds=0.0))
            continue
        start = time.perf_counter()
        try:
            result = run_one(values, workdir, args.fp8)
        except Exception as err:
            result = {"ok": False, "error": f"{type(err).__name__}: {err}", "trace": traceback.format_exc()[-2000:]}
        result.update(key=key(values), seconds=round(time.perf_counter() - start, 3))
        # a Trainer's profiler tears down when it is collected: collect it now, while no other profiler runs
        gc.collect()
        gc.freeze()  # what survives (imports: ~400k objects) is not scanned again: a full collection took 0.25 s
        done[program] = result
        results.append(result)
    if rank == 0:
        Path(args.out).write_text("\n".join(json.dumps(r) for r in results) + "\n")


if __name__ == "__main__":
    main()
