"""The emulated `hpu` device: tensors, copies, autograd, optimizers, serialization, memory and autocast.

Written against torch's own API, as code for a Gaudi is: `device="hpu"`, `.to("hpu")`, `torch.hpu.*`.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from hpu_nb.emulator import hpu_device
from hpu_nb.emulator.backend import EmulatedBackend
from hpu_nb.emulator.hpu_device import autocast as hpu_autocast_lists
from hpu_nb.runtime import is_out_of_memory


@pytest.fixture
def card():
    """A fresh, empty emulated card (96 GiB Gaudi2)."""
    EmulatedBackend()
    hpu_device.fresh_card()
    return torch.hpu


def in_use() -> int:
    return torch.hpu.memory_stats()["InUse"]


# -- tensors -------------------------------------------------------------------------------------------------------
def test_factories_copies_and_printing(card):
    x = torch.randn(8, 4, device="hpu")
    assert x.device == torch.device("hpu", 0) and x.device.type == "hpu"
    host = torch.arange(12.0).reshape(3, 4)
    for moved in (host.to("hpu"), host.hpu() if hasattr(host, "hpu") else host.to("hpu"), host.to(torch.device("hpu"))):
        assert moved.device.type == "hpu" and torch.equal(moved.cpu(), host)
    back = host.to("hpu").to("cpu")
    assert back.device.type == "cpu" and torch.equal(back, host)
    z = torch.zeros(3, 4, device="hpu")
    z.copy_(host)
    assert torch.equal(z.cpu(), host)
    host2 = torch.empty(3, 4)
    host2.copy_(z)
    assert torch.equal(host2, host)
    assert torch.equal(torch.full((2,), 7.0, device="hpu").cpu(), torch.full((2,), 7.0))
    assert "device='hpu:0'" in repr(torch.ones(2, device="hpu"))


def test_dtype_conversion_during_copies(card):
    host = torch.tensor([1.5, -2.25, 3.0])
    on_device = host.to("hpu", dtype=torch.bfloat16)
    assert on_device.dtype == torch.bfloat16 and on_device.device.type == "hpu"
    assert torch.equal(on_device.float().cpu(), host)  # exactly representable in bf16


def test_numpy_is_refused_as_on_a_real_device(card):
    with pytest.raises(TypeError, match=r"can't convert hpu:0 device type tensor to numpy.*Tensor\.cpu\(\)"):
        torch.ones(2, device="hpu").numpy()
    assert torch.ones(2, device="hpu").cpu().numpy().tolist() == [1.0, 1.0]


def test_mixing_hpu_and_cpu_tensors_is_torchs_device_mismatch_error(card):
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device.*hpu:0 and cpu"):
        torch.ones(3, device="hpu") + torch.ones(3)
    # a 0-dim host tensor is a scalar, accepted as on CUDA
    assert torch.equal((torch.ones(3, device="hpu") * torch.tensor(2.0)).cpu(), torch.full((3,), 2.0))


def test_lazy_mode_takes_host_tensors_as_graph_inputs_as_habanas_lazy_bridge(card):
    """Habana's inference tutorials (PT_HPU_LAZY_MODE=1) count `output.max(1)[1].eq(label)` with the labels on the
    CPU: the lazy bridge wraps a CPU tensor given to an hpu op as a graph input. Eager mode refuses the mix."""
    from hpu_nb.runtime.env import lazy_mode_from_env

    out = torch.tensor([[0.1, 0.9], [0.8, 0.2], [0.3, 0.7]]).to("hpu")
    labels = torch.tensor([1, 0, 0])
    torch.ops.hpu_emu.set_lazy_host_inputs(True)
    try:
        correct = out.max(1)[1].eq(labels).sum()
        shifted = out + torch.ones(3, 2)
    finally:
        torch.ops.hpu_emu.set_lazy_host_inputs(lazy_mode_from_env(False))
    assert (correct.device.type, correct.item()) == ("hpu", 2)
    assert shifted.device.type == "hpu" and torch.equal(shifted.cpu(), out.cpu() + 1)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.ones(3, device="hpu").eq(torch.ones(3))


def test_lazy_mode_refuses_an_op_that_writes_a_host_tensor_as_habanas_lazy_bridge(card):
    """Habana's lazy bridge copies CPU inputs to the card, but the tensor an op writes must be an hpu tensor
    (HandleLazy asserts it through GetHbLazyTensor): `cpu.add_(hpu)` fails on a Gaudi, so it does here, and the
    CPU tensor is left as it was. Writing an hpu tensor from CPU inputs is the ordinary lazy case."""
    from hpu_nb.runtime.env import lazy_mode_from_env

    host, device = torch.ones(3), torch.ones(3, device="hpu")
    torch.ops.hpu_emu.set_lazy_host_inputs(True)
    try:
        with pytest.raises(RuntimeError, match=r"non-HPU tensor.*aten::add_.*Move that tensor to hpu first"):
            host.add_(device)
        with pytest.raises(RuntimeError, match=r"non-HPU tensor.*aten::mul\.out"):
            torch.mul(device, 2.0, out=torch.empty(3))
        device.add_(torch.full((3,), 2.0))
    finally:
        torch.ops.hpu_emu.set_lazy_host_inputs(lazy_mode_from_env(False))
    assert torch.equal(host, torch.ones(3))
    assert torch.equal(device.cpu(), torch.full((3,), 3.0))
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        host.add_(device)


_MODE_PROBE = """
import torch, hpu_nb
out, labels = torch.tensor([[0.1, 0.9], [0.8, 0.2]]).to("hpu"), torch.tensor([1, 1])
try:
    correct = out.max(1)[1].eq(labels).sum()
    print(correct.device, correct.item())
except RuntimeError:
    print("refused")
host = torch.ones(3)
try:
    host.add_(torch.ones(3, device="hpu"))
except RuntimeError as error:
    print("in place on cpu refused:", "non-HPU" if "non-HPU" in str(error) else "devices", host.tolist())
"""


@pytest.mark.parametrize(("mode", "expected"), [
    ("1", ["hpu:0 1", "in place on cpu refused: non-HPU [1.0, 1.0, 1.0]"]),
    ("0", ["refused", "in place on cpu refused: devices [1.0, 1.0, 1.0]"]),
])
def test_the_device_reads_the_execution_mode_when_it_loads(mode, expected):
    env = dict(os.environ, PT_HPU_LAZY_MODE=mode)
    out = subprocess.run([sys.executable, "-c", _MODE_PROBE], env=env, capture_output=True, text=True,
                         check=True).stdout
    assert out.strip().splitlines()[-2:] == expected


def test_results_equal_the_cpus(card):
    torch.manual_seed(0)
    a, b = torch.randn(33, 17), torch.randn(17, 9)
    ops = [
        lambda a, b: a @ b,
        lambda a, b: torch.softmax(a, -1),
        lambda a, b: torch.nn.functional.gelu(a).sum(0),
        lambda a, b: torch.cat([a, a]).t().contiguous()[5:, ::2],
        lambda a, b: torch.sort(a, dim=1).values,
        lambda a, b: torch.where(a > 0, a, -a).cumsum(1),
        lambda a, b: a[a > 0.5],
        lambda a, b: torch.nn.functional.layer_norm(a, (17,)),
    ]
    for op in ops:
        expected = op(a, b)
        got = op(a.to("hpu"), b.to("hpu"))
        assert got.device.type == "hpu"
        torch.testing.assert_close(got.cpu(), expected)


def test_views_share_device_memory_and_in_place_ops_write_through(card):
    x = torch.zeros(4, 4, device="hpu")
    view = x[1:3].t()
    assert view.device.type == "hpu" and view.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    view.fill_(5.0)
    assert x.cpu()[1:3].eq(5).all() and x.cpu()[0].eq(0).all()
    x.unsqueeze_(0)
    assert x.shape == (1, 4, 4)
    x.squeeze_()
    assert x.shape == (4, 4)


def test_out_arguments_and_resizing(card):
    out = torch.empty(0, device="hpu")
    torch.add(torch.ones(5, device="hpu"), 1, out=out)
    assert out.shape == (5,) and out.device.type == "hpu" and torch.equal(out.cpu(), torch.full((5,), 2.0))
    r = torch.ones(2, device="hpu")
    r.resize_(10)
    assert r.shape == (10,) and r.device.type == "hpu"


def test_autograd_and_every_optimizer_path(card):
    torch.manual_seed(0)
    reference = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    x, y = torch.randn(16, 6), torch.randn(16, 1)
    variants = [
        (torch.optim.SGD, dict(lr=0.1, momentum=0.9)),
        (torch.optim.Adam, dict(lr=0.01)),
        (torch.optim.AdamW, dict(lr=0.01, foreach=True)),
        (torch.optim.AdamW, dict(lr=0.01, fused=True)),
        (torch.optim.RMSprop, dict(lr=0.01)),
        (torch.optim.Adagrad, dict(lr=0.1)),
    ]
    for cls, kwargs in variants:
        losses = {}
        for device in ("cpu", "hpu"):
            model = _copy(reference).to(device)
            opt = cls(model.parameters(), **kwargs)
            for _ in range(3):
                opt.zero_grad()
                loss = torch.nn.functional.mse_loss(model(x.to(device)), y.to(device))
                loss.backward()
                opt.step()
            assert all(p.device.type == device for p in model.parameters())
            assert all(s.device.type == device for state in opt.state.values() for s in state.values()
                       if isinstance(s, torch.Tensor) and s.dim() > 0)
            losses[device] = loss.item()
        assert losses["hpu"] == pytest.approx(losses["cpu"], rel=1e-5), cls.__name__


def _copy(module: torch.nn.Module) -> torch.nn.Module:
    buffer = io.BytesIO()
    torch.save(module, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


def test_save_and_load_with_map_location(card, tmp_path):
    state = {"w": torch.randn(3, 3, device="hpu"), "step": 3}
    torch.save(state, tmp_path / "s.pt")
    restored = torch.load(tmp_path / "s.pt")
    assert restored["w"].device.type == "hpu" and torch.equal(restored["w"].cpu(), state["w"].cpu())
    on_host = torch.load(tmp_path / "s.pt", map_location="cpu")
    assert on_host["w"].device.type == "cpu"
    from_host = torch.load(_saved_on_host(tmp_path), map_location="hpu")
    assert from_host.device.type == "hpu"
    before = in_use()
    again = torch.load(tmp_path / "s.pt", map_location="hpu")  # loaded onto the device: counted
    assert in_use() - before == 9 * 4
    del again


def _saved_on_host(tmp_path):
    path = tmp_path / "host.pt"
    torch.save(torch.ones(4), path)
    return path


def test_module_to_hpu(card):
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4)).to("hpu")
    assert all(t.device.type == "hpu" for t in [*model.parameters(), *model.buffers()])
    out = model(torch.randn(2, 3, 8, 8, device="hpu"))
    assert out.device.type == "hpu" and out.shape == (2, 4, 6, 6)


# -- memory ----------------------------------------------------------------------------------------------------------
def test_ten_counters_exact_to_the_byte(card):
    stats = torch.hpu.memory_stats()
    assert list(stats) == list(hpu_device.MEMORY_STAT_KEYS)
    assert stats["InUse"] == stats["NumAllocs"] == 0
    layer = torch.nn.Linear(1024, 1024)
    layer.to("hpu")
    param_bytes = (1024 * 1024 + 1024) * 4
    stats = torch.hpu.memory_stats()
    assert stats["InUse"] == param_bytes and stats["NumAllocs"] == 2 and stats["ActiveAllocs"] == 2
    assert stats["MaxAllocSize"] == 1024 * 1024 * 4
    assert torch.hpu.memory_allocated() == param_bytes
    free, total = torch.hpu.mem_get_info()
    assert total == 96 * 2**30 and free == total - param_bytes
    activation = layer(torch.randn(8, 1024, device="hpu"))
    peak = torch.hpu.max_memory_allocated()
    assert peak >= param_bytes + 8 * 1024 * 4 * 2
    del activation, layer
    stats = torch.hpu.memory_stats()
    assert stats["InUse"] == 0 and stats["NumFrees"] == stats["NumAllocs"] and stats["MaxInUse"] == peak
    torch.hpu.reset_peak_memory_stats()
    assert torch.hpu.memory_stats()["MaxInUse"] == 0


def test_host_tensors_never_count_and_device_tensors_always_do(card):
    host = torch.ones(10_000) * 2
    assert in_use() == 0
    device_tensor = torch.ones(1000, device="hpu")  # outside any training step
    assert in_use() == 4000
    del host, device_tensor
    assert in_use() == 0


def test_views_count_once(card):
    x = torch.zeros(256, 256, device="hpu")
    views = [x.t(), x[3:], x.view(-1), x.unsqueeze(0)]
    assert in_use() == 256 * 256 * 4 and torch.hpu.memory_stats()["NumAllocs"] == 1
    del x, views
    assert in_use() == 0


def test_out_of_memory_is_gaudis_message(card):
    EmulatedBackend(memory_limit="1MiB")
    hpu_device.fresh_card()
    with pytest.raises(torch.OutOfMemoryError) as caught:
        torch.zeros(1024, 1024, device="hpu")
    assert "PT_DEVMEM Allocation failed for size::4194304 (4)MB" in str(caught.value)
    assert "emulated GAUDI2" in str(caught.value)
    assert is_out_of_memory(caught.value)
    small = torch.zeros(1000, device="hpu")
    with pytest.raises(torch.OutOfMemoryError):
        small.repeat(1000)  # an op's output over the limit
    assert in_use() == 4000  # nothing of the failed allocations is held
    EmulatedBackend()


def test_a_forked_process_drives_a_fresh_card(card):
    kept = torch.ones(1000, device="hpu")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        try:
            start = torch.hpu.memory_stats()["InUse"]
            y = torch.ones(10, device="hpu")
            del kept  # the parent's tensor: not on this card
            os.write(write, f"{start},{torch.hpu.memory_stats()['InUse']},{y.sum().item()}".encode())
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    start, after, total = os.read(read, 100).decode().split(",")
    assert (int(start), int(after), float(total)) == (0, 40, 10.0)
    assert in_use() == 4000  # the parent's card is untouched


def test_backward_runs_on_the_calling_thread_from_any_thread(card):
    """No autograd device threads for the card (they would break every forked child's backward): backward and
    torch.autograd.grad on hpu tensors run on the thread that calls them, the main thread or another."""
    import threading

    def grads_and_threads() -> tuple[list[float], set[int], int]:
        seen: set[int] = set()
        w = torch.ones(3, device="hpu", requires_grad=True)
        w.register_hook(lambda g: seen.add(threading.get_ident()))
        (w * w).sum().backward()
        (g,) = torch.autograd.grad((w * 3).sum(), w)
        assert g.device.type == "hpu" and g.tolist() == [3.0, 3.0, 3.0]
        return w.grad.tolist(), seen, threading.get_ident()

    grads, seen, me = grads_and_threads()
    assert grads == [2.0, 2.0, 2.0] and seen == {me}
    result = {}
    worker = threading.Thread(target=lambda: result.update(out=grads_and_threads()))
    worker.start()
    worker.join()
    grads, seen, ident = result["out"]
    assert grads == [2.0, 2.0, 2.0] and seen == {ident} and ident != me


def test_torch_still_runs_backward_through_the_engine_hpu_nb_routes():
    """Tripwire: hpu_nb.emulator.hpu_device.backward wraps Variable._execution_engine; torch must still call it."""
    import inspect

    from torch.autograd.variable import Variable

    from hpu_nb.emulator.hpu_device.backward import CallingThreadEngine

    assert "Variable._execution_engine.run_backward(" in inspect.getsource(torch.autograd.graph._engine_run_backward)
    assert isinstance(Variable._execution_engine, CallingThreadEngine)
    assert callable(Variable._execution_engine.queue_callback)  # everything else reaches torch's engine


# -- autocast -----------------------------------------------------------------------------------------------------
def _autocast_dtypes() -> dict[str, torch.dtype]:
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 3).to("hpu")
    x = torch.randn(8, 4, device="hpu")
    with torch.autocast(device_type="hpu", dtype=torch.bfloat16):
        y = lin(x)
        return {
            "linear": y.dtype,
            "softmax": torch.softmax(y, -1).dtype,
            "matmul": (y @ y.t()).dtype,
            "exp": torch.exp(y).dtype,
            "log": torch.log(y.abs()).dtype,
            "div": (y / 2).dtype,
            "pow": y.pow(2).dtype,
            "mse_loss": torch.nn.functional.mse_loss(y, torch.zeros_like(y)).dtype,
            "cross_entropy": torch.nn.functional.cross_entropy(y, torch.zeros(8, dtype=torch.long, device="hpu")).dtype,
            "add_bf16_fp32": (y + torch.ones(3, device="hpu")).dtype,
            "layer_norm": torch.nn.functional.layer_norm(x, (4,)).dtype,
            "relu (not listed)": torch.relu(x).dtype,
        }


def test_autocast_follows_habanas_default_lists(card):
    dtypes = _autocast_dtypes()
    bf16, fp32 = torch.bfloat16, torch.float32
    assert dtypes == {
        "linear": bf16, "softmax": bf16, "matmul": bf16, "exp": fp32, "log": fp32, "div": fp32, "pow": fp32,
        "mse_loss": fp32, "cross_entropy": fp32, "add_bf16_fp32": fp32, "layer_norm": bf16, "relu (not listed)": fp32,
    }
    # CPU autocast's lists differ (exp stays in bf16 there): the emulation is not CPU autocast under another name
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.exp(torch.nn.Linear(4, 3)(torch.randn(2, 4))).dtype == bf16


def test_autocast_fp16_and_disabled_blocks(card):
    lin = torch.nn.Linear(4, 3).to("hpu")
    x = torch.randn(2, 4, device="hpu")
    with torch.autocast("hpu", dtype=torch.float16):
        assert lin(x).dtype == torch.float16
        with torch.autocast("hpu", enabled=False):
            assert lin(x).dtype == torch.float32


def test_op_list_files_replace_the_defaults(tmp_path):
    lower = tmp_path / "lower.txt"
    lower.write_text("exp\n")
    fp32 = tmp_path / "fp32.txt"
    fp32.write_text("linear\n")
    env = {hpu_autocast_lists.LOWER_LIST_ENV: str(lower), hpu_autocast_lists.FP32_LIST_ENV: str(fp32)}
    lists = hpu_autocast_lists.lists_from_environment(env)
    assert lists.lower == {"exp"} and lists.fp32 == {"linear"}
    assert lists.policy("exp") == hpu_autocast_lists.CastPolicy.LOWER
    assert lists.policy("linear") == hpu_autocast_lists.CastPolicy.FP32
    assert lists.policy("softmax") is None  # no longer listed: the file replaced the default list
    assert lists.policy("mse_loss") is None


def test_op_list_files_change_dtypes_in_a_new_process(tmp_path):
    lower, fp32 = tmp_path / "lower.txt", tmp_path / "fp32.txt"
    lower.write_text("exp\nmm\n")
    fp32.write_text("linear\n")
    code = textwrap.dedent("""
        import torch, hpu_nb
        lin = torch.nn.Linear(4, 3).to("hpu")
        x = torch.randn(2, 4, device="hpu")
        with torch.autocast("hpu", dtype=torch.bfloat16):
            y = lin(x)
            print(y.dtype, torch.exp(y).dtype, torch.softmax(y, -1).dtype, (y @ y.t()).dtype)
    """)
    env = dict(os.environ, PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST=str(lower), PT_HPU_AUTOCAST_FP32_OPS_LIST=str(fp32))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["torch.float32", "torch.bfloat16", "torch.float32", "torch.bfloat16"]


def test_old_list_names_are_not_read_and_say_so(tmp_path):
    path = tmp_path / "lower.txt"
    path.write_text("exp\n")
    expected = "LOWER_LIST is not read by Gaudi software 1.19.*PT_HPU_AUTOCAST_LOWER_PRECISION"
    with pytest.warns(UserWarning, match=expected):
        lists = hpu_autocast_lists.lists_from_environment({"LOWER_LIST": str(path)})
    assert lists.lower == hpu_autocast_lists.DEFAULT_LOWER_OPS


@pytest.mark.parametrize("content,match", [(b"\xff\xfe\x00binary", "not a text file"), (None, "cannot be read")])
def test_unreadable_list_files_keep_the_default_with_a_warning(tmp_path, content, match):
    path = tmp_path / "ops.txt"
    if content is not None:
        path.write_bytes(content)
    with pytest.warns(UserWarning, match=match):
        lists = hpu_autocast_lists.lists_from_environment({hpu_autocast_lists.FP32_LIST_ENV: str(path)})
    assert lists.fp32 == hpu_autocast_lists.DEFAULT_FP32_OPS


def test_list_lines_that_are_not_aten_ops_are_named(tmp_path):
    path = tmp_path / "ops.txt"
    path.write_text("linear\nLinear \n# comment\n")
    with pytest.warns(UserWarning, match=r"2 line\(s\).*'# comment'.*'Linear '"):
        hpu_autocast_lists.lists_from_environment({hpu_autocast_lists.LOWER_LIST_ENV: str(path)})


@pytest.mark.parametrize("name", ["/dev/zero", "fifo"])
def test_a_device_or_fifo_named_as_an_op_list_is_refused_at_once(tmp_path, name):
    """/dev/zero used to be read forever (22 GB until the OOM killer); a FIFO with no writer blocked forever."""
    path = name
    if name == "fifo":
        path = str(tmp_path / "ops.fifo")
        os.mkfifo(path)
    for env in (hpu_autocast_lists.LOWER_LIST_ENV, hpu_autocast_lists.FP32_LIST_ENV):
        with pytest.warns(UserWarning, match="not a regular file"):
            lists = hpu_autocast_lists.lists_from_environment({env: path})
        assert lists.lower == hpu_autocast_lists.DEFAULT_LOWER_OPS and lists.fp32 == hpu_autocast_lists.DEFAULT_FP32_OPS


def test_addmm_computes_in_the_common_dtype_as_habanas_and_mm_refuses_a_mix_as_habanas() -> None:
    """Habana's addmm promotes self, mat1 and mat2 to their common dtype (the bridge's AddMMMeta), where the CPU
    kernel refuses mixed dtypes: a bf16 activation left by an autocast region runs through an fp32 nn.Linear (2-D input
    with bias) in fp32. Its mm (MmMeta) refuses a mix, as the CPU does."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(8, 3)
    x = torch.randn(4, 8).to(torch.bfloat16)
    expected = linear(x.float())
    out = linear.to("hpu")(x.to("hpu"))
    assert out.dtype == torch.float32
    assert torch.equal(out.cpu(), expected)
    with pytest.raises(RuntimeError, match="same dtype"):
        torch.mm(x.to("hpu"), torch.randn(8, 2, device="hpu"))
