"""Tripwire: hpu_nb.core.mixed_precision's HPUGradScaler replaces two methods of torch's GradScaler and reads its
private state. A torch upgrade that renames or reshapes any of it must fail here, not in a user's 16-mixed run.
"""

from __future__ import annotations

import inspect

import torch
from torch.amp import grad_scaler
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

# (owner, private name, what in hpu_nb depends on it)
TORCH_PRIVATE_NAMES = [
    (torch.amp.GradScaler, "_enabled", "HPUGradScaler.update / HPUShardedGradScaler.__init__: a disabled scaler"),
    (torch.amp.GradScaler, "_check_scale_growth_tracker", "HPUGradScaler.update / _unscale_grads_: the state"),
    (torch.amp.GradScaler, "_per_optimizer_states", "HPUGradScaler.update: every optimizer's found_inf"),
    (torch.amp.GradScaler, "_growth_factor", "HPUGradScaler.update"),
    (torch.amp.GradScaler, "_backoff_factor", "HPUGradScaler.update"),
    (torch.amp.GradScaler, "_growth_interval", "HPUGradScaler.update"),
    (torch.amp.GradScaler, "_unscale_grads_", "HPUGradScaler._unscale_grads_ replaces it (plain tensor ops)"),
    (ShardedGradScaler, "_unscale_grads_", "HPUShardedGradScaler._unscale_grads_ replaces it"),
    *[(torch.nn.Module, name, "plan/fake_step.model_on_fake_device: swaps every tensor for a fake one, puts them back")
      for name in ("_parameters", "_buffers", "_modules")],
]


def _sets(owner: type, name: str) -> bool:
    source = inspect.getsource(owner)
    return (f"self.{name} =" in source or f'super().__setattr__("{name}",' in source  # nn.Module sets its own so
            or any(name in vars(base) for base in owner.__mro__))


def test_the_private_names_the_scaler_uses_are_still_there() -> None:
    missing = [f"{owner.__name__}.{name} ({depends})" for owner, name, depends in TORCH_PRIVATE_NAMES
               if not _sets(owner, name)]
    assert not missing, f"torch no longer has: {missing}"
    assert callable(grad_scaler._refresh_per_optimizer_state)  # HPUGradScaler.update resets the states with it


def test_gradscaler_still_calls_what_hpu_gradscaler_replaces() -> None:
    """unscale_ hands the work to _unscale_grads_(optimizer, inv_scale, found_inf, allow_fp16) and step() reads
    the found_inf_per_device it returns; update() without a new scale still runs _amp_update_scale_ (the op Habana's
    bridge lacks, which HPUGradScaler.update replaces)."""
    unscale = inspect.getsource(torch.amp.GradScaler.unscale_)
    assert "self._unscale_grads_(" in unscale and '"found_inf_per_device"' in unscale
    assert list(inspect.signature(torch.amp.GradScaler._unscale_grads_).parameters) == [
        "self", "optimizer", "inv_scale", "found_inf", "allow_fp16"]
    assert "_amp_foreach_non_finite_check_and_unscale_" in inspect.getsource(torch.amp.GradScaler._unscale_grads_)
    assert "_amp_update_scale_" in inspect.getsource(torch.amp.GradScaler.update)
    sharded = inspect.getsource(ShardedGradScaler.unscale_)
    assert "self._unscale_grads_(" in sharded and "all_reduce" in sharded


def test_the_flight_recorder_still_skips_groups_of_self_recording_backends() -> None:
    """hpu_nb.emulator.hpu_device.hccl adds "hccl" to torch's self-recording backends (from torch 2.15, a new group of
    another backend gets a flight-recorder hook, which the emulated HCCL's ProcessGroup subclass cannot take)."""
    import torch.distributed.distributed_c10d as c10d

    from hpu_nb.emulator.hpu_device import hccl

    attach = getattr(c10d, "_maybe_attach_flight_recorder", None)
    if attach is None:  # torch before 2.15 attaches no hook from Python
        assert not hasattr(c10d, "_FR_SELF_RECORDING_BACKENDS")
        return
    assert "_FR_SELF_RECORDING_BACKENDS" in inspect.getsource(attach)
    hccl.register()
    assert hccl.BACKEND_NAME in c10d._FR_SELF_RECORDING_BACKENDS


def test_sharded_tensor_device_is_still_torchs_rule_that_hpu_nb_repeats() -> None:
    """core.strategy_parts.fsdp._sharded_tensor_device repeats torch's ShardedTensor.device rule (local shard, gloo's
    CPU, else CUDA) with the HCCL group's HPU inserted, and registers it with torch's public custom-op hook, which
    dispatch consults before the built-in table."""
    from torch.distributed._shard.sharded_tensor import api
    from torch.distributed._shard.sharded_tensor._ops import tensor_ops

    rule = inspect.getsource(tensor_ops.tensor_device)
    for part in ("self_st._local_shards[0].tensor.device", 'pg._get_backend_name() == "gloo"',
                 'torch.device("cpu")', "torch.device(torch.cuda.current_device())"):
        assert part in rule, f"torch's ShardedTensor.device rule changed: {part!r} is gone"
    dispatch = inspect.getsource(api.ShardedTensor.__torch_function__)
    assert dispatch.index("_CUSTOM_SHARDED_OPS") < dispatch.index("_SHARDED_OPS[func]")

    from hpu_nb.core.strategy_parts.fsdp import sharded_tensors_on_hpu

    sharded_tensors_on_hpu()
    assert torch.Tensor.device.__get__ in api._CUSTOM_SHARDED_OPS
