"""Lightning internals, checked: a Lightning upgrade that changes anything hpu_nb copies, patches or relies on fails
here, loudly, naming the hpu_nb code to re-check; and every override in hpu_nb.core says so with @override."""

from __future__ import annotations

import ast
import hashlib
import importlib
import inspect
import pkgutil
import re
import sys
from pathlib import Path

import pytest

import hpu_nb.core
from tests.runtime.test_torch_tripwire import TORCH_PRIVATE_NAMES

# (module, qualified name, sha256[:16] of its source in the Lightning release hpu_nb supports, what depends on it)
FINGERPRINTS = [
    ("lightning.pytorch.trainer.connectors.accelerator_connector", "_AcceleratorConnector.__init__",
     "d610bdfbe380b204", "registration.install_connector_hook: the hooked methods are called from here"),
    ("lightning.pytorch.trainer.connectors.accelerator_connector",
     "_AcceleratorConnector._check_config_and_set_final_flags", "9d2fb6cc22739133",
     "registration: wrapped for precision='fp8' (keyword arguments; sets _precision_flag / _precision_plugin_flag)"
     " and for refuse_other_flavour (reads its strategy / accelerator / plugins arguments)"),
    ("lightning.pytorch.trainer.connectors.accelerator_connector", "_AcceleratorConnector._choose_strategy",
     "81e89d03604243ef", "registration: wrapped for HPU (Lightning raises 'HPU is currently not supported')"),
    ("lightning.pytorch.trainer.connectors.accelerator_connector", "_AcceleratorConnector._check_and_init_precision",
     "09dff7904c627040", "registration: wrapped for HPU (selection.choose_precision)"),
    ("lightning.pytorch.trainer.connectors.accelerator_connector", "_AcceleratorConnector._choose_auto_accelerator",
     "1b8c7af74bc28143", "registration: wrapped (a real Gaudi is 'auto')"),
    ("lightning.fabric.connector", "_Connector.__init__", "d812e0f2fdd05ae1",
     "registration.install_fabric_connector_hook: the hooked methods are called from here"),
    ("lightning.fabric.connector", "_Connector._check_config_and_set_final_flags", "a6f4cddfc43e9512",
     "registration: wrapped for precision='fp8' (keyword arguments; sets _precision_input / _precision_instance)"
     " and for refuse_other_flavour (reads its strategy / accelerator / plugins arguments)"),
    ("lightning.fabric.connector", "_Connector._choose_strategy", "a4f082ff16cf61b2",
     "registration: wrapped for HPU (Lightning picks a CPU SingleDeviceStrategy)"),
    ("lightning.fabric.connector", "_Connector._check_and_init_precision", "d0c28a357381f900",
     "registration: wrapped for HPU (Lightning picks CUDA's MixedPrecision)"),
    ("lightning.fabric.connector", "_Connector._choose_auto_accelerator", "b3271d8226967149",
     "registration: wrapped (a real Gaudi is 'auto')"),
    ("lightning.pytorch.trainer.setup", "_init_profiler", "21bfb52262230c5a",
     "profiler.register_profiler_string: wrapped so that profiler='hpu' builds an HPUProfiler"),
    ("lightning.pytorch.profilers.pytorch", "PyTorchProfiler._default_activities", "7eb973d6d9e36c67",
     "profiler.HPUProfiler._default_activities: replaced (CPU + HPU)"),
    ("lightning.pytorch.strategies.fsdp", "_get_full_state_dict_context", "b310d11a415783d0",
     "strategies/fsdp._full_state_dict_offload: swapped for one call"),
    ("lightning.pytorch.strategies.fsdp", "FSDPStrategy._setup_model", "b51232a59b16d0ad",
     "strategies/fsdp.HPUFSDPStrategy._setup_model: a copy that names the hpu device"),
    ("lightning.pytorch.strategies.fsdp", "FSDPStrategy.model_sharded_context", "539000382262ef26",
     "strategies/fsdp.HPUFSDPStrategy.model_sharded_context: a copy that names the hpu device"),
    ("lightning.pytorch.strategies.fsdp", "FSDPStrategy.setup_environment", "a17c4f1528869219",
     "HPUParallelMixin._get_process_group_backend: must be called right before init_process_group"),
    ("lightning.fabric.strategies.fsdp", "FSDPStrategy._setup_distributed", "0328942ff8047257",
     "HPUParallelMixin._get_process_group_backend: must be called right before init_process_group"),
    ("lightning.pytorch.strategies.ddp", "DDPStrategy.setup_distributed", "015c382c0ed570f6",
     "HPUParallelMixin._get_process_group_backend: must be called right before init_process_group"),
    ("lightning.fabric.strategies.ddp", "DDPStrategy._setup_distributed", "2904a02873d123c4",
     "HPUParallelMixin._get_process_group_backend: must be called right before init_process_group"),
    ("lightning.pytorch.strategies.ddp", "DDPStrategy._configure_launcher", "0869347d2833203c",
     "HPUParallelMixin._configure_launcher: replaced (fork in a notebook, spawn, script)"),
    ("lightning.fabric.strategies.ddp", "DDPStrategy._configure_launcher", "0869347d2833203c",
     "HPUParallelMixin._configure_launcher: replaced (fork in a notebook, spawn, script)"),
    ("lightning.pytorch.strategies.launchers.multiprocessing", "_MultiProcessingLauncher.launch",
     "10cced3a0af64ee5", "parallel.ForkCheckMixin.launch: wraps it"),
    ("lightning.fabric.strategies.launchers.multiprocessing", "_MultiProcessingLauncher.launch",
     "b9099f11d7397435", "parallel.ForkCheckMixin.launch: wraps it"),
    ("lightning.pytorch.strategies.deepspeed", "DeepSpeedStrategy.setup_environment", "de7e179a7fc99ab5",
     "strategies/deepspeed.HPUDeepSpeedStrategy.setup_environment: replaced (no CUDA-only check)"),
    ("lightning.pytorch.strategies.deepspeed", "DeepSpeedStrategy.setup_distributed", "78cee79c7c131102",
     "strategies/deepspeed.HPUDeepSpeedStrategy.setup_distributed: a copy"),
    ("lightning.pytorch.strategies.deepspeed", "DeepSpeedStrategy._init_deepspeed_distributed", "4a4df8858860216f",
     "strategies/deepspeed.HPUDeepSpeedStrategy._init_deepspeed_distributed: a copy with HCCL set-up"),
    ("lightning.pytorch.strategies.deepspeed", "DeepSpeedStrategy._setup_model_and_optimizer", "6a7d1e7daa636a60",
     "strategies/deepspeed.HPUDeepSpeedStrategy._setup_model_and_optimizer: a copy (device named by local rank)"),
    ("lightning.pytorch.strategies.deepspeed", "DeepSpeedStrategy._initialize_deepspeed_inference",
     "dc47d956a17bc6ac",
     "strategies/deepspeed_inference.DeepSpeedInferenceMixin._initialize_deepspeed_inference: a copy"),
    ("lightning.pytorch.strategies.deepspeed", "DeepSpeedStrategy._format_config", "e4c7bc1cd605458b",
     "strategies/deepspeed.HPUDeepSpeedStrategy._format_config: extends it (fp8: the config's bf16 section)"),
    ("lightning.fabric.strategies.deepspeed", "_format_precision_config", "f4b00730bca1f6e7",
     "strategies/deepspeed.HPUDeepSpeedStrategy._format_config: called with the plugin's engine precision"),
    ("lightning.pytorch.trainer.connectors.callback_connector", "_CallbackConnector._attach_model_logging_functions",
     "f9247c99e02d7a51", "notebook/memory_monitor.MemoryMonitor._release_the_model: drops the `log` / `log_dict` "
     "attributes this sets on every callback (they pin the model and Trainer to a chart that outlives the run)"),
    ("lightning.pytorch.plugins.precision.fsdp", "FSDPPrecision.mixed_precision_config", "e54fd0bd3bd9fcd2",
     "strategy_parts/fsdp.HPUFSDPPrecisionMixin.mixed_precision_config: replaced ('-mixed' keeps fp32 parameters)"),
    ("lightning.fabric.plugins.precision.fsdp", "FSDPPrecision.mixed_precision_config", "ffb119428db67169",
     "strategy_parts/fsdp.HPUFSDPPrecisionMixin.mixed_precision_config: replaced ('-mixed' keeps fp32 parameters)"),
    ("lightning.pytorch.trainer.setup", "_log_device_info", "a06acbbba5a0bc2c",
     "trainer_output.install: replaced for an HPU Trainer (one HPU line for its GPU / TPU lines; the filter drops "
     "the tips it logs after them)"),
    ("lightning.pytorch.trainer.connectors.logger_connector.logger_connector", "_LoggerConnector.log_metrics",
     "ac6f000b838713fb", "notebook/memory_monitor.MemoryMonitor._log: logs at the step Lightning's own metrics use "
     "(fit_loop.epoch_loop._batches_that_stepped)"),
    ("lightning.pytorch.trainer.connectors.logger_connector.logger_connector", "_LoggerConnector.should_update_logs",
     "a60ba9e9cd0c62d9", "notebook/memory_monitor.MemoryMonitor._log: logs only on the steps Lightning logs on"),
    ("lightning.pytorch.plugins.precision.amp", "MixedPrecision.optimizer_step", "63b0bee2018bdb88",
     "precision.HPUPrecisionPlugin.optimizer_step: its loss-scaler steps, with the scaler on hpu (16-mixed)"),
    ("lightning.fabric.plugins.precision.amp", "MixedPrecision.optimizer_step", "dbb71fcd9a178d0d",
     "fabric/precision.HPUPrecision.optimizer_step: its loss-scaler steps, with the scaler on hpu (16-mixed)"),
    ("lightning.fabric.plugins.precision.amp", "MixedPrecision.backward", "912ed8d9a7531cc7",
     "fabric/precision.HPUPrecision.backward: scales the loss as it does"),
    ("lightning.pytorch.plugins.precision.fsdp", "FSDPPrecision.__init__", "f5581bdb7f55f719",
     "strategy_parts/fsdp.HPUFSDPPrecisionMixin._init_fsdp_precision: calls it, then sets the scaler (Lightning's is "
     "CUDA's, and a scaler given to it is dropped)"),
    ("lightning.fabric.plugins.precision.fsdp", "FSDPPrecision.__init__", "f5581bdb7f55f719",
     "strategy_parts/fsdp.HPUFSDPPrecisionMixin._init_fsdp_precision (Fabric's HPUFSDPPrecision): as above"),
    ("lightning.pytorch.strategies.launchers.multiprocessing",
     "_MultiProcessingLauncher._recover_results_in_main_process", "66fb649a9d9f25ff",
     "strategies/trainer_results: restores what this does not (the loops' progress, the logged and progress-bar "
     "metrics); if Lightning now brings them back, drop hpu_nb's copy"),
    ("lightning.pytorch.strategies.launchers.multiprocessing", "_MultiProcessingLauncher.update_main_process_results",
     "f3bd116bd601b479", "strategies/launchers.HPUMultiProcessingLauncher.update_main_process_results: pops its own "
     "extra keys, then calls it (it must still read only `callback_metrics_bytes`)"),
    ("lightning.pytorch.loops.loop", "_Loop.load_state_dict", "3a3062891e2c17e4",
     "strategies/trainer_results.restore: loads rank 0's loop progress with it, then undoes its 'restarting' marks "
     "with on_iteration_done"),
    ("lightning.pytorch.loops.loop", "_Loop.on_iteration_done", "e30c5339d69d6279",
     "strategies/trainer_results._not_restarting: clears what load_state_dict set"),
    ("lightning.pytorch.utilities._pytree", "_tree_flatten", "5c57c674b766814c",
     "trainer_output._leaf_spec_without_warning: Lightning's _pytree.LeafSpec is torch's treespec_leaf (it is only"
     " constructed, `LeafSpec()`, never used in isinstance)"),
    ("lightning.fabric.utilities.cloud_io", "_load", "2a7aa617333664ad",
     "checkpoint_io.HPUCheckpointIO.load_checkpoint: passes weights_only=True for what this treats as a URL "
     "(`str(path).startswith('http')`, defaulted to weights_only=False here); _is_url must match its test"),
]


def _original(module: str, qualname: str) -> object:
    obj: object = importlib.import_module(module)
    owner = None
    for part in qualname.split("."):
        owner, obj = obj, getattr(obj, part)
    originals = getattr(owner, "_hpu_nb_originals", {}) if owner is not None else {}
    obj = originals.get(qualname.rsplit(".", 1)[-1], obj)
    obj = getattr(obj, "_hpu_nb_original", obj)  # the profiler hook keeps Lightning's function here
    return obj.fget if isinstance(obj, property) else obj


@pytest.mark.parametrize("module, qualname, fingerprint, depends", FINGERPRINTS,
                         ids=[f"{m.split('.')[1]}:{q}" for m, q, _, _ in FINGERPRINTS])
def test_lightning_code_hpu_nb_copies_or_patches_is_unchanged(module, qualname, fingerprint, depends):
    source = inspect.getsource(_original(module, qualname))
    got = hashlib.sha256(source.encode()).hexdigest()[:16]
    assert got == fingerprint, (
        f"Lightning changed {module}.{qualname} (fingerprint {got}, expected {fingerprint}). hpu_nb depends on it: "
        f"{depends}. Re-check that code against the new source, then update the fingerprint here."
    )


def test_the_hooks_are_in_place_on_what_lightning_calls():
    from lightning.fabric.connector import _Connector
    from lightning.pytorch.trainer import setup
    from lightning.pytorch.trainer.connectors.accelerator_connector import _AcceleratorConnector

    for connector in (_AcceleratorConnector, _Connector):
        assert connector._hpu_nb_hooked
        init = inspect.getsource(connector.__init__)
        assert "self._choose_strategy()" in init and "self._check_and_init_precision()" in init
        assert "self._check_config_and_set_final_flags(" in init and "precision=precision," in init
        assert "self._choose_auto_accelerator()" in init
    assert setup._init_profiler._hpu_nb_hooked
    from lightning.pytorch.trainer import trainer

    assert "_init_profiler(self, profiler)" in inspect.getsource(trainer.Trainer.__init__)
    # trainer_output wraps the module's function: the Trainer must look it up there when it is built
    assert "setup._log_device_info(self)" in inspect.getsource(trainer.Trainer.__init__)


@pytest.mark.parametrize("package", ["pytorch_lightning", "lightning_fabric"])
def test_the_standalone_packages_still_end_their_init_with_the_import_hpu_nb_waits_for(package):
    """hpu_nb/wiring/lightning_registration.py: registration waits for `<package>._graveyard` when torch's autoload runs
    inside the package's own import (as `import pytorch_lightning` makes it)."""
    from hpu_nb.wiring.lightning_registration import LAST_IMPORT

    spec = importlib.util.find_spec(package)
    lines = [line for line in Path(spec.origin).read_text().splitlines() if line.startswith(("import ", "from "))]
    assert lines[-1].startswith(f"import {LAST_IMPORT[package]}")


# -- private names hpu_nb reads or sets on Lightning's objects --------------------------------------------------------
# Methods hpu_nb overrides are checked by the @override test below (an @override that overrides nothing fails) and,
# where hpu_nb copies or wraps them, by FINGERPRINTS above. Everything else private that hpu_nb touches is listed here:
# (module, owner in it or "" for the module itself, name, what depends on it).
PRIVATE_NAMES = [
    # imported
    ("lightning.pytorch.trainer.connectors.accelerator_connector", "", "_AcceleratorConnector", "registration"),
    ("lightning.pytorch.trainer.connectors.accelerator_connector", "", "_IS_INTERACTIVE",
     "strategy_parts/launchers.in_interactive_session: Lightning accepts fork launchers only when it is True"),
    ("lightning.fabric.connector", "", "_Connector", "registration"),
    ("lightning.pytorch.trainer.setup", "", "_log_device_info", "trainer_output.install"),
    ("lightning.pytorch.trainer.setup", "", "_init_profiler", "profiler.register_profiler_string"),
    ("lightning.fabric.utilities.cloud_io", "", "_atomic_save", "checkpoint_io"),
    ("lightning.fabric.utilities.cloud_io", "", "_load", "checkpoint_io"),
    ("lightning.fabric.utilities.types", "", "_PATH", "checkpoint_io (a type)"),
    ("lightning.fabric.utilities.types", "", "_DEVICE", "accelerator, strategies (a type)"),
    ("lightning.fabric.accelerators.registry", "", "_AcceleratorRegistry", "accelerator.register_accelerators"),
    ("lightning.fabric.strategies.launchers.multiprocessing", "", "_MultiProcessingLauncher", "fabric/strategies"),
    ("lightning.fabric.strategies.launchers.subprocess_script", "", "_SubprocessScriptLauncher", "fabric/strategies"),
    ("lightning.pytorch.strategies.launchers.multiprocessing", "", "_MultiProcessingLauncher", "strategies/launchers"),
    ("lightning.pytorch.strategies.launchers.subprocess_script", "", "_SubprocessScriptLauncher",
     "strategies/launchers"),
    ("lightning.fabric.plugins.precision.utils", "", "_convert_fp_tensor", "strategies/deepspeed_precision"),
    ("lightning.fabric.strategies.deepspeed", "", "_format_precision_config", "strategies/deepspeed"),
    ("lightning.pytorch.core.optimizer", "", "_MockOptimizer", "strategies/deepspeed._init_optimizers"),
    ("lightning.pytorch.core.optimizer", "", "_init_optimizers_and_lr_schedulers",
     "strategies/deepspeed._init_optimizers"),
    ("lightning.pytorch.core.optimizer", "", "_configure_optimizers",
     "plan/fake_step._optimizers_of: configure_optimizers' return value normalised as Lightning does"),
    ("lightning.pytorch.plugins.io.wrapper", "", "_WrappingCheckpointIO", "strategy_parts/guards.checkpoint_io"),
    ("lightning.pytorch.strategies.fsdp", "", "_move_torchmetrics_to_device", "strategies/fsdp._setup_model (copy)"),
    ("lightning.pytorch.strategies.fsdp", "", "_setup_activation_checkpointing",
     "strategies/fsdp._setup_model (copy)"),
    ("lightning.fabric.utilities.distributed", "", "_distributed_is_initialized", "strategy_parts/parallel"),
    ("lightning.pytorch.utilities", "", "_pytree", "trainer_output._leaf_spec_without_warning (its LeafSpec name)"),
    ("lightning.fabric.utilities.distributed", "", "_set_num_threads_if_needed", "strategy_parts/launchers"),
    # read or set on Lightning's objects
    ("lightning.pytorch.trainer.connectors.accelerator_connector", "_AcceleratorConnector", "_precision_flag",
     "registration.install_connector_hook"),
    ("lightning.pytorch.trainer.connectors.accelerator_connector", "_AcceleratorConnector", "_precision_plugin_flag",
     "registration.install_connector_hook"),
    ("lightning.pytorch.trainer.connectors.accelerator_connector", "_AcceleratorConnector",
     "_validate_precision_choice", "registration.install_connector_hook"),
    ("lightning.fabric.connector", "_Connector", "_precision_input", "registration.install_fabric_connector_hook"),
    ("lightning.fabric.connector", "_Connector", "_precision_instance", "registration.install_fabric_connector_hook"),
    *[(module, owner, name, "registration._hook_connector._choose_strategy")
      for module, owner in (("lightning.pytorch.trainer.connectors.accelerator_connector", "_AcceleratorConnector"),
                            ("lightning.fabric.connector", "_Connector"))
      for name in ("_accelerator_flag", "_parallel_devices", "_num_nodes_flag")],
    ("lightning.pytorch.profilers.pytorch", "PyTorchProfiler", "_profiler_kwargs", "profiler.HPUProfiler"),
    ("lightning.pytorch.profilers.pytorch", "PyTorchProfiler", "_row_limit", "profiler.HPUProfiler.summary"),
    ("lightning.pytorch.profilers.pytorch", "PyTorchProfiler", "_delete_profilers", "profiler.HPUProfiler"),
    ("lightning.pytorch.profilers.profiler", "Profiler", "_prepare_filename", "profiler.HPUProfiler"),
    ("lightning.pytorch.profilers.profiler", "Profiler", "_stats_to_str", "profiler.HPUProfiler.summary"),
    ("lightning.pytorch.profilers.profiler", "Profiler", "_rank_zero_info", "profiler.HPUProfiler"),
    ("lightning.pytorch.profilers.profiler", "Profiler", "_stage", "profiler.HPUProfiler"),
    ("lightning.pytorch.loops.loop", "", "_Loop", "strategies/trainer_results"),
    ("lightning.pytorch.trainer.trainer", "Trainer", "_logger_connector", "strategies/trainer_results"),
    *[("lightning.pytorch.trainer.connectors.logger_connector.logger_connector", "_LoggerConnector", name,
       "strategies/trainer_results.restore: rank 0's metrics merged into it")
      for name in ("_logged_metrics", "_progress_bar_metrics")],
    ("lightning.pytorch.trainer.trainer", "Trainer", "_logger_connector", "notebook/memory_monitor._log"),
    ("lightning.pytorch.loops.training_epoch_loop", "_TrainingEpochLoop", "_batches_that_stepped",
     "notebook/memory_monitor._log: the step its metrics are logged at"),
    ("lightning.pytorch.strategies.launchers.multiprocessing", "_MultiProcessingLauncher", "_start_method",
     "notebook/memory_monitor.workers_launched (a forked launch relays rank 0's chart)"),
    ("lightning.pytorch.strategies.launchers.multiprocessing", "_MultiProcessingLauncher", "_strategy",
     "strategy_parts/launchers"),
    ("lightning.pytorch.strategies.strategy", "Strategy", "_accelerator", "strategy_parts/guards"),
    ("lightning.pytorch.strategies.strategy", "Strategy", "_checkpoint_io", "strategy_parts/guards.checkpoint_io"),
    ("lightning.pytorch.strategies.strategy", "Strategy", "_precision_plugin", "strategies/fsdp"),
    ("lightning.pytorch.strategies.strategy", "Strategy", "_launcher", "strategy_parts/parallel._configure_launcher"),
    ("lightning.fabric.strategies.strategy", "Strategy", "_precision", "fabric/strategies.HPUFSDPStrategy"),
    ("lightning.pytorch.strategies.ddp", "DDPStrategy", "_process_group_backend", "strategy_parts/parallel"),
    ("lightning.pytorch.strategies.fsdp", "FSDPStrategy", "_registered_strategies", "strategies/fsdp"),
    ("lightning.pytorch.strategies.fsdp", "FSDPStrategy", "_activation_checkpointing_kwargs",
     "strategies/fsdp._setup_model (copy)"),
    ("lightning.pytorch.plugins.precision.precision", "Precision", "_after_closure",
     "precision.HPUPrecisionPlugin.optimizer_step (16-mixed: on_before_optimizer_step and clipping after unscaling)"),
    ("lightning.pytorch.strategies.deepspeed", "DeepSpeedStrategy", "_set_node_environment_variables",
     "strategies/deepspeed._init_deepspeed_distributed (copy)"),
    # `_timeout`: HPUParallelMixin makes it a property (strategy's timeout, else the env var, else 5 min); see below
    *[(module, owner, "_timeout", "strategy_parts/parallel.HPUParallelMixin._timeout")
      for module, owner in (("lightning.pytorch.strategies.ddp", "DDPStrategy"),
                            ("lightning.pytorch.strategies.fsdp", "FSDPStrategy"),
                            ("lightning.pytorch.strategies.deepspeed", "DeepSpeedStrategy"),
                            ("lightning.fabric.strategies.ddp", "DDPStrategy"),
                            ("lightning.fabric.strategies.fsdp", "FSDPStrategy"))],
]


def _lightning_sets(owner: type, name: str) -> bool:
    """`name` is a class attribute of `owner` or one of its Lightning bases, or assigned as `self.<name>` in one."""
    assigned = re.compile(rf"\bself\.{name}\b\s*(:[^=\n]+)?=(?!=)")
    for klass in owner.__mro__:
        if not klass.__module__.startswith("lightning."):
            continue
        if name in vars(klass) or assigned.search(inspect.getsource(klass)):
            return True
    return False


@pytest.mark.parametrize("module, owner, name, depends", PRIVATE_NAMES,
                         ids=[f"{(o or m.rsplit('.', 1)[-1])}.{n}" for m, o, n, _ in PRIVATE_NAMES])
def test_the_private_names_hpu_nb_uses_are_still_there(module, owner, name, depends):
    where = importlib.import_module(module)
    if owner:
        where = getattr(where, owner)
        found = _lightning_sets(where, name)
    else:
        found = hasattr(where, name)
    assert found, f"Lightning has no {module}.{owner + '.' if owner else ''}{name} any more; hpu_nb uses it: {depends}."


def test_the_timeout_hpu_nb_replaces_is_lightnings_timeout_argument():
    """HPUParallelMixin._timeout's setter takes Lightning's default (torch's 30 minutes) for "not set": each strategy
    it is mixed into must still store its `timeout` argument, defaulting to that object, in `self._timeout`."""
    from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout

    for module, owner, name, _ in PRIVATE_NAMES:
        if name != "_timeout":
            continue
        init = getattr(importlib.import_module(module), owner).__init__
        assert inspect.signature(init).parameters["timeout"].default is default_pg_timeout, (module, owner)
        assert re.search(r"self\._timeout\b[^=\n]*= timeout\n", inspect.getsource(init)), (module, owner)


LIGHTNING_PACKAGES = {"lightning": "lightning", "pytorch_lightning": "lightning.pytorch",
                      "lightning_fabric": "lightning.fabric"}


def _as_lightning_module(module: str) -> str:
    """`pytorch_lightning.x` -> `lightning.pytorch.x` (the standalone packages are the same source)."""
    package, _, rest = module.partition(".")
    return LIGHTNING_PACKAGES[package] + ("." + rest if rest else "")


def _hpu_nb_sources() -> list[tuple[Path, ast.Module]]:
    root = Path(hpu_nb.__file__).parent
    return [(path, ast.parse(path.read_text(), str(path))) for path in sorted(root.rglob("*.py"))]


def test_every_private_lightning_import_in_hpu_nb_is_listed():
    """A new `from lightning... import _name` in hpu_nb fails here until PRIVATE_NAMES says who depends on it."""
    listed = {(module, name) for module, owner, name, _ in PRIVATE_NAMES if not owner}
    unlisted = []
    for path, tree in _hpu_nb_sources():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in LIGHTNING_PACKAGES:
                module = _as_lightning_module(node.module)
                for alias in node.names:
                    if alias.name.startswith("_") and not alias.name.startswith("__") and \
                            (module, alias.name) not in listed:
                        unlisted.append(f"{path.name}:{node.lineno} {node.module}.{alias.name}")
    assert not unlisted, f"private Lightning imports without a tripwire (add them to PRIVATE_NAMES): {unlisted}"


def test_every_private_lightning_attribute_hpu_nb_reads_is_listed():
    """A net for new reliances: an attribute `x._name` read in hpu_nb, where `_name` is something Lightning defines
    (`def _name` / `self._name =`) and hpu_nb itself does not, must be in PRIVATE_NAMES."""
    lightning_root = Path(importlib.util.find_spec("lightning").origin).parent
    defined_by_lightning = set()
    for path in lightning_root.rglob("*.py"):
        defined_by_lightning.update(re.findall(r"(?:\bdef |\bself\.)(_[a-z]\w*)\s*[:=(]", path.read_text()))
    ours, read = set(), {}
    for path, tree in _hpu_nb_sources():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                ours.add(node.name)
            elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                if isinstance(node.ctx, ast.Store):
                    ours.add(node.attr)
                read.setdefault(node.attr, f"{path.name}:{node.lineno}")
    listed = {name for _, _, name, _ in PRIVATE_NAMES} | {name for _, name, _ in TORCH_PRIVATE_NAMES}  # torch's own
    unlisted = {name: where for name, where in read.items()
                if name in defined_by_lightning and name not in ours and name not in listed}
    assert not unlisted, f"private Lightning attributes without a tripwire (add them to PRIVATE_NAMES): {unlisted}"


# -- @override on every override (every module of hpu_nb.core) ------------------------------------------------------


def _our_classes() -> list[type]:
    classes = []
    for info in pkgutil.walk_packages(hpu_nb.core.__path__, "hpu_nb.core."):
        module = importlib.import_module(info.name)
        classes += [c for c in vars(module).values() if isinstance(c, type) and c.__module__ == module.__name__]
    return classes


def _function(value: object) -> object:
    value = value.fget if isinstance(value, property) else value
    return getattr(value, "__func__", value)


def test_every_override_says_so_and_nothing_else_does():
    """A method that replaces one of a class further along the MRO (Lightning's, or a mixin's) carries @override;
    a method marked @override replaces something in at least one of our concrete classes."""
    classes = _our_classes()
    overriding: set[tuple[type, str]] = set()
    for concrete in classes:
        mro = concrete.__mro__
        for i, owner in enumerate(mro):
            if not owner.__module__.startswith("hpu_nb.core"):
                continue
            for name in vars(owner):
                if not (name.startswith("__") and name.endswith("__")) and any(
                        name in vars(later) for later in mro[i + 1:] if later is not object):
                    overriding.add((owner, name))
    missing, stray = [], []
    for owner in classes:
        for name, value in vars(owner).items():
            function = _function(value)
            if not callable(function) or (name.startswith("__") and name.endswith("__")):
                continue
            marked = bool(getattr(function, "__override__", False))
            where = f"{owner.__module__}.{owner.__qualname__}.{name}"
            if (owner, name) in overriding and not marked:
                missing.append(where)
            if marked and (owner, name) not in overriding:
                stray.append(where)
    assert not missing, f"overrides without @override: {missing}"
    assert not stray, f"@override on methods that override nothing: {stray}"
    assert sys.modules["hpu_nb.core.fabric.strategies"]  # the Fabric classes were checked too


def test_lightning_still_defaults_url_checkpoints_to_weights_only_false_as_hpu_checkpoint_io_counters():
    """HPUCheckpointIO passes weights_only=True for URLs because Lightning's `_load` turns None into False for them
    (issue 28 item 1). If Lightning's test for a URL changes, hpu_nb's `_is_url` must change with it."""
    from lightning.fabric.utilities import cloud_io

    from hpu_nb.core.checkpoint_io import _is_url

    source = inspect.getsource(cloud_io._load)
    assert 'if str(path_or_url).startswith("http"):' in source, (
        "Lightning changed how `_load` recognises a URL: update hpu_nb.core.checkpoint_io._is_url to match")
    assert _is_url("https://example.com/a.ckpt") and _is_url("http://h/a.ckpt") and not _is_url("/tmp/a.ckpt")
