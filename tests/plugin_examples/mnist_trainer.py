"""lightning-habana's examples/pytorch/mnist_trainer.py, rewritten for hpu_nb: one MNIST classifier trained (or
tested) once per feature: plain, torch.autocast, HPUPrecisionPlugin, Lightning's MixedPrecision on "hpu", the recipe
cache, fp8 training, fp8 inference (measure, then quantize, in one process) and, optionally, several tenants sharing
the machine's cards. Synthetic MNIST-shaped data (tests/plugin_examples/synthetic.py) replaces the download.

Custom autocast op lists, as the plugin's example: PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST=ops_lower_mnist.txt
PT_HPU_AUTOCAST_FP32_OPS_LIST=ops_fp32_mnist.txt python mnist_trainer.py -r autocast (LOWER_LIST / FP32_LIST before
Gaudi software 1.19). Prints one line "RESULT {json}" per run type.
"""

from __future__ import annotations

import argparse
import json
import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import lightning as L
import torch.multiprocessing as mp
from lightning.pytorch.plugins.precision import MixedPrecision
from mnist_sample import LitAutocastClassifier, LitClassifier
from synthetic import MNISTLikeDataModule

from hpu_nb import HPUAccelerator, HPUDDPStrategy, HPUPrecisionPlugin, SingleHPUStrategy

RUN_TYPES = ["basic", "autocast", "HPUPrecisionPlugin", "MixedPrecisionPlugin", "recipe_caching", "fp8_training",
             "fp8_inference"]
OPTIONAL_RUN_TYPES = ["multi_tenancy"]
OP_LIST_VARIABLES = ("PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST", "PT_HPU_AUTOCAST_FP32_OPS_LIST", "LOWER_LIST",
                     "FP32_LIST")
MAX_CARDS = 8


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="MNIST on HPU, one run per feature.")
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.add_argument("-r", "--run_types", nargs="+", choices=RUN_TYPES + OPTIONAL_RUN_TYPES, default=RUN_TYPES)
    parser.add_argument("-n", "--num_tenants", type=int, default=2, help="tenants sharing the machine")
    parser.add_argument("-c", "--devices_per_tenant", type=int, default=2, help="cards per tenant")
    parser.add_argument("-d", "--devices", type=int, default=1, help="cards for the other run types")
    return parser.parse_args()


@contextmanager
def environment(overrides: dict[str, str] | None) -> Iterator[None]:
    """Set variables for the duration of a run, then put the previous values back (errors are not swallowed)."""
    saved = {key: os.environ.get(key) for key in overrides or {}}
    os.environ.update(overrides or {})
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def run_trainer(model: L.LightningModule, data: L.LightningDataModule, plugin: Any, devices: int = 1,
                strategy: Any = None, stage: str = "fit") -> dict[str, float]:
    if strategy is None:
        strategy = HPUDDPStrategy() if devices > 1 else SingleHPUStrategy()
    trainer = L.Trainer(accelerator=HPUAccelerator(), devices=devices, strategy=strategy, plugins=plugin,
                        fast_dev_run=True, enable_progress_bar=False, enable_model_summary=False)
    getattr(trainer, stage)(model, data)
    return {name: float(value) for name, value in trainer.callback_metrics.items()}


def spawn_tenants(model: L.LightningModule, data: L.LightningDataModule, devices: int, num_tenants: int) -> None:
    """Each tenant a process of its own, on its own cards (HABANA_VISIBLE_MODULES) and rendezvous port."""
    processes = []
    for tenant in range(num_tenants):
        process = mp.Process(target=run_trainer,
                             args=(model, data, None, devices, HPUDDPStrategy(start_method="spawn")))
        modules = ",".join(str(card) for card in range(tenant * devices, (tenant + 1) * devices))
        with environment({"HABANA_VISIBLE_MODULES": modules, "MASTER_PORT": str(29600 + tenant)}):
            print(f"Spawning tenant {tenant} on modules {modules}")
            process.start()
        processes.append(process)
    for process in processes:
        process.join()
        if process.exitcode != 0:
            raise RuntimeError(f"a tenant failed with exit code {process.exitcode}")


def get_model(run_type: str) -> tuple[L.LightningModule, L.LightningDataModule]:
    data = MNISTLikeDataModule(batch_size=32)
    if run_type != "autocast":
        return LitClassifier(), data
    if not any(name in os.environ for name in OP_LIST_VARIABLES):
        warnings.warn("To override operators with autocast, name op-list files in"
                      " PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST / PT_HPU_AUTOCAST_FP32_OPS_LIST.", stacklevel=2)
        return LitAutocastClassifier(), data
    return LitAutocastClassifier(op_override=True), data


def get_plugin(run_type: str) -> Any:
    if run_type == "HPUPrecisionPlugin":
        return HPUPrecisionPlugin(device="hpu", precision="bf16-mixed")
    if run_type == "MixedPrecisionPlugin":
        return MixedPrecision(device="hpu", precision="bf16-mixed")
    if "fp8" in run_type:
        return HPUPrecisionPlugin(device="hpu", precision="fp8")
    return None


def run(run_type: str, options: argparse.Namespace) -> dict[str, Any]:
    L.seed_everything(42)
    model, data = get_model(run_type)
    plugin = get_plugin(run_type)
    if run_type == "multi_tenancy":
        per_tenant = min(options.devices_per_tenant, MAX_CARDS)
        tenants = min(options.num_tenants, MAX_CARDS // per_tenant)
        spawn_tenants(model, data, per_tenant, tenants)
        return {"run_type": run_type, "tenants": tenants}
    if run_type == "fp8_training":
        plugin.convert_modules(model, replace_layers=True, inference=False)
    if run_type == "fp8_inference":
        plugin.convert_modules(model, inference=True, quant=False)  # measure on a sample of the data
        run_trainer(model, data, plugin, options.devices, stage="test")
        plugin.convert_modules(model, inference=True, quant=True)  # then quantize with the measurements
    stage = "test" if "inference" in run_type else "fit"
    overrides = {"PT_HPU_RECIPE_CACHE_CONFIG": "tmp/recipes,True,1024"} if run_type == "recipe_caching" else None
    with environment(overrides):
        metrics = run_trainer(model, data, plugin, options.devices, stage=stage)
    layers = sorted({f"{type(m).__module__}.{type(m).__name__}" for m in model.modules() if m is not model})
    result = {"run_type": run_type, "metrics": metrics, "layers": layers}
    if isinstance(model, LitAutocastClassifier):
        result["override_checks"] = model.override_checks
    return result


def main() -> None:
    options = parse_args()
    if options.verbose:
        print(f"Running MNIST on HPU with {options}")
    for run_type in options.run_types:
        if HPUAccelerator.get_device_name() == "GAUDI" and "fp8" in run_type:
            print("fp8 is not supported on first-generation Gaudi. Skipping.")
            continue
        print("RESULT " + json.dumps(run(run_type, options)), flush=True)


if __name__ == "__main__":
    main()
