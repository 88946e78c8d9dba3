"""The fake Gaudi keeps to Habana's published behaviour (gaudi-pytorch-bridge): one test per fact, named after it.

Each test checks the fake's behaviour (side effects included) as Habana's published source has it, so tests of hpu_nb
against the fake fail where the real Gaudi would. The rows on HPU graphs and dynamic shapes belong to the work that
adds those APIs; the `hl-smi` parsing rows are covered in depth by tests/runtime/test_hlsmi.py.
"""

from __future__ import annotations

import datetime
import importlib
import inspect
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from tests.fake_habana import FakeHabana, install_fake_habana
from tests.fake_habana.hlsmi import FakeHlSmi

MiB = 1 << 20
ROOT = Path(__file__).resolve().parents[2]


def run_python(fake: FakeHabana, code: str, env: dict[str, str] | None = None, timeout: float = 120) -> str:
    """Run `code` in a fresh interpreter on the same fake machine; its stdout (fails the test on a non-zero exit)."""
    full = fake.subprocess_env()
    full["PYTHONPATH"] = os.pathsep.join([full["PYTHONPATH"], str(ROOT)])
    for key in ("PT_HPU_LAZY_MODE", "HLS_MODULE_ID", "HABANA_VISIBLE_MODULES", "WORLD_SIZE", "RANK", "LOCAL_RANK",
                "MASTER_PORT", "MASTER_ADDR", "HABANA_PROFILE"):
        full.pop(key, None)
    full.update(env or {})
    done = subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def hthpu():
    return importlib.import_module("habana_frameworks.torch.hpu")


# -- releases and defaults ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("release", "lazy"), [("1.17.1", True), ("1.18.0", True), ("1.19.0", True), ("1.20.1", True),
                                               ("1.21.0", False), ("1.22.0", False), ("1.23.0", False)])
def test_releases_lazy_mode_default_until_1_20_eager_from_1_21(release, lazy):
    with install_fake_habana(release=release) as fake:
        import habana_frameworks.torch.core as htcore

        assert htcore.is_lazy() is lazy
        from torch._dynamo.backends.registry import _COMPILER_FNS

        # torch.compile's backend is registered in either mode (1.19's core imports dynamo.compile_backend.backends)
        assert _COMPILER_FNS["hpu_backend"].__module__.startswith("habana_frameworks")
        assert fake.acquisitions() == []


def test_releases_1_19_renames_op_list_variables_and_makes_te_a_shim():
    with install_fake_habana(release="1.18.0") as fake:
        assert fake.config.op_list_envs == ("LOWER_LIST", "FP32_LIST")
        te = importlib.import_module("habana_frameworks.torch.hpex.experimental.transformer_engine")
        assert te.Linear.__module__ == "habana_frameworks.torch.hpex.experimental.transformer_engine"
    with install_fake_habana(release="1.19.0") as fake:
        assert fake.config.op_list_envs == ("PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST", "PT_HPU_AUTOCAST_FP32_OPS_LIST")
        te = importlib.import_module("habana_frameworks.torch.hpex.experimental.transformer_engine")
        assert te.Linear.__module__ == "intel_transformer_engine"


def test_releases_1_22_drop_first_generation_gaudi():
    with install_fake_habana(release="1.21.0", device_name="GAUDI", device_count=1):
        assert hthpu().get_device_name() == "GAUDI"
    with install_fake_habana(release="1.22.0", device_name="GAUDI", device_count=1) as fake:
        assert hthpu().is_available() and hthpu().device_count() == 1  # the driver still sees the card
        with pytest.raises(RuntimeError, match="GAUDI is not supported by Gaudi software 1.22"):
            hthpu().get_device_name()
        assert fake.acquisitions() == []


def test_releases_import_torch_autoloads_habana_in_eager_mode():
    with install_fake_habana(release="1.21.0") as fake:
        code = "import sys, torch; print('habana_frameworks.torch' in sys.modules, torch.hpu.__name__)"
        assert run_python(fake, code).split() == ["True", "habana_frameworks.torch.hpu"]
        code = "import sys, torch; print('habana_frameworks.torch' in sys.modules)"
        assert run_python(fake, code, {"PT_HPU_LAZY_MODE": "1"}).split() == ["False"]
        assert run_python(fake, code, {"PT_HPU_AUTOLOAD": "0"}).split() == ["False"]
    with install_fake_habana(release="1.18.0") as fake:  # lazy by default: no autoload unless asked for
        loaded = run_python(fake, "import sys, torch; print('habana_frameworks.torch' in sys.modules)")
        assert loaded.split() == ["False"]


# -- habana_frameworks.torch.hpu ------------------------------------------------------------------------------------
def test_hpu_is_available_and_device_count_acquire_no_card(fake_gaudi):
    assert hthpu().is_available() and hthpu().device_count() == 8
    assert not hthpu().is_initialized() and fake_gaudi.acquisitions() == []


def test_hpu_torch_knows_the_accelerator_from_import_without_a_card(fake_gaudi):
    """Habana's HPU hooks answer hasHPU() true once its library is loaded (HPUHooksInterface.cpp), so torch's
    accelerator is hpu with no card acquired: Lightning's DDP passes device_id=hpu:0 to init_process_group."""
    out = run_python(fake_gaudi, "import torch, habana_frameworks.torch, habana_frameworks.torch.hpu as h;"
                                 " print(torch.accelerator.current_accelerator(), h.is_initialized())")
    assert out.split() == ["hpu", "False"]
    assert fake_gaudi.acquisitions() == []


@pytest.mark.parametrize("call", ["get_device_name", "current_device", "synchronize", "memory_stats", "mem_get_info"])
def test_hpu_get_device_name_and_most_calls_acquire_a_card(make_fake_gaudi, call):
    fake = make_fake_gaudi(device_name="GAUDI3", device_count=4)
    result = getattr(hthpu(), call)()
    assert hthpu().is_initialized()
    (acquired,) = fake.acquisitions()
    assert (acquired["pid"], acquired["card"]) == (os.getpid(), 0)
    if call == "get_device_name":
        assert result == "GAUDI3" and hthpu().get_device_name(3) == "GAUDI3"  # the index is checked, not used
        with pytest.raises(AssertionError, match="Invalid device id"):
            hthpu().get_device_name(4)
    getattr(hthpu(), call)()
    assert len(fake.acquisitions()) == 1  # once per process


def test_hpu_forked_child_of_an_initialised_parent_cannot_use_the_device(fake_gaudi):
    hthpu().get_device_name()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            try:
                hthpu().memory_stats()
                os.write(write, b"used the device")
            except RuntimeError as err:
                os.write(write, str(err).encode())
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    message = os.read(read, 4000).decode()
    assert "a forked child cannot use the device its parent acquired" in message
    assert hthpu().memory_stats()["Limit"] > 0  # the parent still can


def test_hpu_acquisition_by_hls_module_id_else_any_free_card(make_fake_gaudi):
    fake = make_fake_gaudi(device_count=4)
    code = "import habana_frameworks.torch.hpu as h; h.init(); print(h.card)"
    assert run_python(fake, code, {"HLS_MODULE_ID": "2"}).split() == ["2"]
    # HABANA_VISIBLE_MODULES is not consulted when acquiring by type: the first free card, whatever the tenant's list
    assert run_python(fake, code, {"HABANA_VISIBLE_MODULES": "2,3"}).split() == ["0"]
    hthpu().init()  # this process now holds card 0
    assert fake.acquisitions()[-1]["card"] == 0 and fake.acquisitions()[-1]["pid"] == os.getpid()
    assert run_python(fake, code).split() == ["1"]  # card 0 is held: the next free one
    code_strict = ("import habana_frameworks.torch.hpu as h\ntry:\n    h.init(); print('acquired', h.card)\n"
                   "except RuntimeError as e:\n    print('refused', e)")
    out = run_python(fake, code_strict, {"HLS_MODULE_ID": "0", "HABANA_VISIBLE_MODULES": "0,1"})
    assert out.startswith("refused synStatus=8 [Device already acquired] Device acquire failed.")
    # without HABANA_VISIBLE_MODULES the bridge falls back to any free card when the module id is taken
    assert run_python(fake, code_strict, {"HLS_MODULE_ID": "0"}).split() == ["acquired", "1"]
    assert [a["how"] for a in fake.acquisitions()].count("by HLS_MODULE_ID=2") == 1


def test_hpu_memory_stats_keys_and_helpers(make_fake_gaudi):
    from hpu_nb.emulator import hpu_device

    fake = make_fake_gaudi(memory_limit=1000 * MiB)
    hthpu().init()
    hpu_device.fresh_card()
    held = torch.empty(300 * MiB, dtype=torch.uint8, device="hpu")
    stats = hthpu().memory_stats("hpu:0")
    assert list(stats) == ["Limit", "InUse", "MaxInUse", "NumAllocs", "NumFrees", "ActiveAllocs", "MaxAllocSize",
                           "TotalSystemAllocs", "TotalSystemFrees", "TotalActiveAllocs"]
    assert all(type(v) is int for v in stats.values()) and stats["Limit"] == fake.config.limit()
    assert hthpu().memory_allocated() == 300 * MiB and hthpu().max_memory_allocated() == 300 * MiB
    del held
    hthpu().reset_peak_memory_stats()
    assert hthpu().max_memory_allocated() == 0 and hthpu().mem_get_info() == (1000 * MiB, 1000 * MiB)
    assert hthpu().hpu is hthpu() and hthpu().memory_stats.__module__ == "habana_frameworks.torch.hpu"


def test_hpu_out_of_memory_message(make_fake_gaudi):
    make_fake_gaudi(memory_limit=64 * MiB)
    hthpu().init()
    with pytest.raises(RuntimeError, match=r"PT_DEVMEM Allocation failed for size::\d+ \(\d+(\.\d+)?\)MB"):
        torch.empty(128 * MiB, dtype=torch.uint8, device="hpu")


def test_hpu_metrics_unknown_name_is_none_and_recipe_cache_needs_its_variable(fake_gaudi, monkeypatch):
    metrics = importlib.import_module("habana_frameworks.torch.hpu.metrics")
    assert metrics.metric_global("no_such_metric") is None
    assert metrics.metric_global("recipe_cache") is None  # PT_HPU_ENABLE_CACHE_METRICS is not set
    stats = metrics.metric_global("graph_compilation").stats()
    assert stats == [("TotalNumber", 0), ("TotalTime", 0), ("AvgTime", 0)]
    assert [tag for tag, _ in metrics.metric_global("cpu_fallback").stats()] == ["TotalNumber", "FallbackOps"]
    code = ("import habana_frameworks.torch.hpu.metrics as m; print(m.metric_global('recipe_cache') is not None)")
    assert run_python(fake_gaudi, code, {"PT_HPU_ENABLE_CACHE_METRICS": "1"}).split() == ["True"]


# -- habana_frameworks.torch.core -----------------------------------------------------------------------------------
def test_core_mark_step_runs_the_graph_in_lazy_mode_and_is_a_no_op_in_eager_mode():
    for release, graphs in (("1.18.0", 2), ("1.22.0", 0)):
        with install_fake_habana(release=release):
            import habana_frameworks.torch.core as htcore

            ran = []
            htcore.add_step_closure(ran.append, ("closure",))
            htcore.mark_step()
            htcore.mark_step(sync=True)
            assert htcore.graphs_run == graphs and ran == (["closure"] if graphs else [])
            assert str(inspect.signature(htcore.mark_step)) == "(device_str='', sync=False)"


def test_core_is_lazy_only_the_literal_0_means_eager():
    """is_lazy() is `!= "0"`; but importing habana_frameworks.torch imports distributed.hccl, which reads the mode with
    int(): any value but an integer fails the import (the bridge's torch/__init__.py and hccl/__init__.py)."""
    for value, lazy in (("0", False), ("1", True), ("2", True)):
        with install_fake_habana(release="1.22.0") as fake:
            code = "import habana_frameworks.torch.core as c; print(c.is_lazy())"
            assert run_python(fake, code, {"PT_HPU_LAZY_MODE": value, "PT_HPU_AUTOLOAD": "0"}).split() == [str(lazy)]
    for value in ("false", ""):
        with install_fake_habana(release="1.22.0") as fake, \
                pytest.raises(AssertionError, match="invalid literal for int"):
            run_python(fake, "import habana_frameworks.torch.core", {"PT_HPU_LAZY_MODE": value, "PT_HPU_AUTOLOAD": "0"})


def test_core_hpu_set_env_and_hpu_initialize_signatures(fake_gaudi):
    import habana_frameworks.torch.core as htcore

    params = inspect.signature(htcore.hpu_initialize).parameters
    assert list(params) == ["model", "mark_only_scales_as_const", "optimizer", "args"]
    assert params["mark_only_scales_as_const"].default is False
    htcore.hpu_set_env()
    htcore.hpu_initialize(torch.nn.Linear(2, 2), mark_only_scales_as_const=True)
    assert fake_gaudi.calls.named("hpu_initialize")[0].kwargs == {"mark_only_scales_as_const": True}


def test_core_torch_compile_hpu_backend_in_eager_mode(make_fake_gaudi):
    fake = make_fake_gaudi(release="1.21.0")
    import habana_frameworks.torch.core  # noqa: F401  (registers it, as Habana's does)

    torch._dynamo.reset()
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)).to("hpu")
    x = torch.randn(4, 8, device="hpu")
    compiled = torch.compile(model, backend="hpu_backend")
    assert torch.allclose(compiled(x).cpu(), model(x).cpu(), atol=1e-6)
    assert fake.calls.count("hpu_backend") == 1 and fake.state.metrics["graph_compilation"]["TotalNumber"] == 1


# -- habana_frameworks.torch.distributed.hccl ---------------------------------------------------------------------
def test_hccl_import_initialises_from_the_environment_and_may_set_master_port(fake_gaudi):
    out = run_python(fake_gaudi, "import os, habana_frameworks.torch.distributed.hccl\n"
                                 "print(os.environ.get('MASTER_ADDR'), os.environ.get('MASTER_PORT'))")
    assert out.split() == ["localhost", "12345"]
    show_port = "import os, habana_frameworks.torch.distributed.hccl\nprint(os.environ['MASTER_PORT'])"
    out = run_python(fake_gaudi, show_port, {"MASTER_PORT": "29555"})
    assert out.split() == ["29555"]
    out = run_python(fake_gaudi, "import os, habana_frameworks.torch.distributed.hccl\n"
                                 "print(os.environ.get('MASTER_PORT'), os.environ['HLS_MODULE_ID'], os.environ['ID'])",
                     {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1", "HABANA_VISIBLE_MODULES": "4,5"})
    assert out.split() == ["None", "5", "1"]  # a launcher's full set of variables: the port is left alone


def test_hccl_initialize_distributed_hpu_sets_ranks_and_the_module_id(fake_gaudi, monkeypatch):
    from habana_frameworks.torch.distributed.hccl import initialize_distributed_hpu

    monkeypatch.setenv("HABANA_VISIBLE_MODULES", "4,5,6,7")
    assert initialize_distributed_hpu(world_size=4, rank=2, local_rank=2) == (4, 2, 2)
    keys = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "ID", "HLS_MODULE_ID")
    assert [os.environ[k] for k in keys] == ["4", "2", "2", "2", "6"]
    del os.environ["HLS_MODULE_ID"]  # (the fake's uninstall restores it; monkeypatch would put this value back)
    monkeypatch.setenv("HABANA_VISIBLE_MODULES", "4")
    with pytest.raises(AssertionError, match="not enough devices"):
        initialize_distributed_hpu(world_size=4, rank=2, local_rank=2)
    monkeypatch.delenv("HABANA_VISIBLE_MODULES")
    initialize_distributed_hpu(world_size=4, rank=3, local_rank=3)
    assert os.environ["HLS_MODULE_ID"] == "3"


def test_hccl_reduce_semantics_on_hpu_tensors_only(fake_gaudi):
    import habana_frameworks.torch.distributed.hccl  # noqa: F401
    import torch.distributed as dist

    dist.init_process_group("hccl", store=dist.HashStore(), rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=20))
    try:
        assert dist.get_backend() == "hccl"
        value = torch.tensor([1.5, -2.0], device="hpu")
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.MIN, dist.ReduceOp.MAX, dist.ReduceOp.AVG):
            dist.all_reduce(value, op=op)
            assert value.device.type == "hpu" and value.tolist() == [1.5, -2.0]
        with pytest.raises(RuntimeError, match="HCCL collectives take hpu tensors"):
            dist.all_reduce(torch.tensor([1.0]))
    finally:
        dist.destroy_process_group()


# -- transformer engine ------------------------------------------------------------------------------------------------
def test_transformer_engine_shim_class_modules_are_intel_transformer_engine(fake_gaudi):
    te = importlib.import_module("habana_frameworks.torch.hpex.experimental.transformer_engine")
    layer = te.Linear(4, 4)
    assert type(layer).__module__ == "intel_transformer_engine" and isinstance(layer, te.Linear)
    assert "habana_frameworks" not in type(layer).__module__  # module-path checks see nothing: use isinstance
    assert sys.modules["habana_frameworks.torch.hpex.experimental.transformer_engine.recipe"] is te.recipe


def test_transformer_engine_linear_fp8_autocast_and_recipe(fake_gaudi):
    te = importlib.import_module("habana_frameworks.torch.hpex.experimental.transformer_engine")
    torch.manual_seed(0)
    layer = te.Linear(64, 32, bias=True)
    x = torch.randn(16, 64)
    exact = torch.nn.functional.linear(x, layer.weight, layer.bias)
    recipe = te.recipe.DelayedScaling(margin=0, interval=1, fp8_format=te.recipe.Format.HYBRID, amax_history_len=16,
                                      amax_compute_algo="max")
    with te.fp8_autocast(enabled=True, fp8_recipe=recipe):
        out = layer(x)
    assert out.dtype == torch.float32  # fp8 modules output the activation dtype: the input's without autocast
    with te.fp8_autocast(enabled=True, fp8_recipe=recipe), torch.autocast("cpu", dtype=torch.bfloat16):
        assert layer(x).dtype == torch.bfloat16  # autocast's under autocast
    assert 1e-3 < ((out.float() - exact).norm() / exact.norm()).item() < 0.1


def test_transformer_engine_fp8_only_on_gaudi2_and_newer():
    with install_fake_habana(release="1.21.0", device_name="GAUDI"):
        te = importlib.import_module("habana_frameworks.torch.hpex.experimental.transformer_engine")
        with pytest.raises(RuntimeError, match="Gaudi2 or newer"), te.fp8_autocast(enabled=True):
            pass


@pytest.mark.parametrize(("device_name", "full_scale"), [("GAUDI2", 240.0), ("GAUDI3", 448.0)])
def test_transformer_engine_scales_to_the_generations_e4m3_full_scale(make_fake_gaudi, device_name, full_scale):
    """Gaudi2's e4m3 ends at 240, Gaudi3's at 448 (INC's get_fullscale): the scale aims max |x| at that value."""
    make_fake_gaudi(device_name=device_name)
    te = importlib.import_module("habana_frameworks.torch.hpex.experimental.transformer_engine")
    layer = te.Linear(3, 1, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[1.0, 0.0, 0.0]]))
    x = torch.tensor([[0.013, 1.0, 0.0]])  # 1 maps to the full scale; 0.013 rounds on that grid: 3/240 or 6/448
    with te.fp8_autocast(enabled=True):
        out = layer(x)
    expected = (x * full_scale).to(torch.float8_e4m3fn).float() / full_scale
    assert out[0, 0].item() == expected[0, 0].item() == pytest.approx(
        {240.0: 3 / 240, 448.0: 6 / 448}[full_scale], rel=1e-2)


# -- legacy tensor types, metrics, the media loader --------------------------------------------------------------------
@pytest.mark.parametrize("device", ["hpu:0", torch.device("hpu")])
def test_legacy_tensor_types_compare_the_device_with_the_string_hpu(fake_gaudi, device):
    hpu_module = hthpu()
    assert hpu_module.LongTensor([1, 2], device="hpu").dtype == torch.int64
    with pytest.raises(RuntimeError, match=f"^legacy constructor expects device type: hpu but device type: {device}"
                                           " was passed$"):
        hpu_module.LongTensor([1, 2], device=device)


def test_metrics_local_context_counts_its_block_only_and_unknown_names_raise_metric_not_found(fake_gaudi):
    metrics = importlib.import_module("habana_frameworks.torch.hpu.metrics")
    from habana_frameworks.torch.hpu.metrics.exceptions import MetricNotFound

    assert metrics.MetricNotFound is MetricNotFound
    fake_gaudi.set_metric("graph_compilation", TotalNumber=3)
    with metrics.metric_localcontext("graph_compilation") as local:
        fake_gaudi.set_metric("graph_compilation", TotalNumber=4)  # one compilation inside the block
    fake_gaudi.set_metric("graph_compilation", TotalNumber=6)
    assert dict(local.stats())["TotalNumber"] == 1 and dict(metrics.metric_global("graph_compilation").stats())[
        "TotalNumber"] == 6
    assert metrics.metric_global("recipe_cache") is None
    with (pytest.raises(MetricNotFound, match=r"Metric with given name \(recipe_cache\) doesn't exist."),
          metrics.metric_localcontext("recipe_cache")):
        pass


def test_habana_dataloader_wrapper_forwards_no_attribute(fake_gaudi, capsys):
    """Habana's HabanaDataLoader keeps its loader in `.dataloader` and forwards nothing: scripts reach through it."""
    import habana_dataloader
    from torch.utils.data import TensorDataset

    loader = habana_dataloader.HabanaDataLoader(TensorDataset(torch.arange(6.0)), batch_size=4)
    assert "Running with PyTorch Dataloader" in capsys.readouterr().out  # not an image folder: torch's loader
    assert loader.dataloader.batch_size == 4 and [len(b[0]) for b in loader] == [4, 2] and len(loader) == 2
    for name in ("batch_size", "sampler", "dataset", "fallback_activated"):
        assert not hasattr(loader, name)


# -- autocast and op lists -----------------------------------------------------------------------------------------
def test_autocast_on_hpu_with_the_release_op_lists_replacing_the_defaults(tmp_path):
    lower = tmp_path / "lower.txt"
    lower.write_text("exp\n")  # the file replaces Habana's default lower list: exp lowered, linear no longer
    code = ("import torch, habana_frameworks.torch.core\nl = torch.nn.Linear(4, 4).to('hpu'); x = torch.randn(2, 4,"
            " device='hpu')\nwith torch.autocast('hpu', dtype=torch.bfloat16):\n    print(l(x).dtype, x.exp().dtype)")
    for release, variable in (("1.18.0", "LOWER_LIST"), ("1.19.0", "PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST")):
        with install_fake_habana(release=release) as fake:
            assert run_python(fake, code).split() == ["torch.bfloat16", "torch.float32"]  # the default lists
            assert run_python(fake, code, {variable: str(lower)}).split() == ["torch.float32", "torch.bfloat16"]
            other = "LOWER_LIST" if variable != "LOWER_LIST" else "PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST"
            assert run_python(fake, code, {other: str(lower)}).split() == ["torch.bfloat16", "torch.float32"]


# -- profiler ------------------------------------------------------------------------------------------------------
def test_profiler_import_swaps_torch_profiler_classes_and_sets_habana_profile():
    originals = (torch.profiler.ProfilerActivity, torch.profiler.profile, torch.autograd.profiler.profile)
    with install_fake_habana():
        import habana_frameworks.torch  # noqa: F401

        activity = torch.profiler.ProfilerActivity
        assert [a.name for a in activity] == ["CPU", "CUDA", "HPU"]
        assert activity.__module__ == "habana_frameworks.torch.activity_profiler.activity_profiler"
        assert torch.profiler.profile is not originals[1] and issubclass(torch.profiler.profile, originals[1])
        assert torch.autograd.profiler.profile is not originals[2]
        assert os.environ["HABANA_PROFILE"] == "profile_api_light"
        with torch.profiler.profile(activities=[activity.CPU, activity.HPU]) as prof:
            torch.ones(3).sum()
        assert prof.hpu_profiling_active and any(e.name == "aten::sum" for e in prof.events())
    assert (torch.profiler.ProfilerActivity, torch.profiler.profile, torch.autograd.profiler.profile) == originals
    assert "HABANA_PROFILE" not in os.environ


# -- versions and packaging ------------------------------------------------------------------------------------------
def test_versions_namespace_package_without_version_read_the_distribution():
    from importlib.metadata import version

    with install_fake_habana(release="1.21.0"):
        import habana_frameworks
        import habana_frameworks.torch

        assert getattr(habana_frameworks, "__file__", None) is None and list(habana_frameworks.__path__)
        assert not hasattr(habana_frameworks.torch, "__version__") and not hasattr(habana_frameworks, "__version__")
        assert version("habana-torch-plugin") == "1.21.0"


# -- device facts from the command line --------------------------------------------------------------------------------
def test_device_facts_hl_smi_answers_without_acquiring_a_card(fake_gaudi, fake_hlsmi: FakeHlSmi):
    out = subprocess.run(["hl-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    assert "[0] AIP (accel0)" in out and "hl-gaudi2-" in out
    assert fake_gaudi.acquisitions() == [] and fake_hlsmi.invocations() == [["-L"]]


def test_device_facts_pyhlml_bytes_names_bytes_memory_milliwatts(make_fake_gaudi):
    fake = make_fake_gaudi(pyhlml=True, device_count=2)
    fake.allocate(5 * MiB, index=1)
    hlml = fake.pyhlml
    hlml.hlmlInit()
    handle = hlml.hlmlDeviceGetHandleByIndex(1)
    assert hlml.hlmlDeviceGetName(handle) == b"HL-225"
    assert hlml.hlmlDeviceGetMemoryInfo(handle).used == 5 * MiB
    assert hlml.hlmlDeviceGetPowerUsage(handle) == 182_000 and hlml.hlmlDeviceGetTemperature(handle, 0) == 41
    assert fake.acquisitions() == []


# -- the fake's own hygiene ------------------------------------------------------------------------------------------
def test_uninstall_puts_back_torch_and_the_emulated_surface():
    from hpu_nb.emulator import hpu_device
    from hpu_nb.runtime import get_backend

    get_backend()
    hpu_device.load()  # the emulated Gaudi in use before the fake (loading its device registers "hccl")
    emulated_hpu = torch.hpu
    with install_fake_habana():
        import habana_frameworks.torch  # noqa: F401

        assert torch.hpu is not emulated_hpu and "hccl" in torch.distributed.Backend.backend_list
    assert torch.hpu is emulated_hpu and sys.modules["habana_frameworks.torch.hpu"] is emulated_hpu
    assert "hccl" in torch.distributed.Backend.backend_list  # the emulated Gaudi registered it first
    assert not any(name.startswith("intel_transformer_engine") for name in sys.modules)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert json.dumps(torch.hpu.memory_stats())  # still usable


# -- fp8 inference: Intel Neural Compressor (tests/helpers/fake_neural_compressor.py) ----------------------------------
def test_fp8_inference_inc_config_defaults_and_rank_named_measurement_files(tmp_path, monkeypatch):
    from tests.helpers.fake_neural_compressor import install_fake_inc

    with install_fake_inc():
        from neural_compressor.torch.quantization import FP8Config, convert, finalize_calibration, prepare

        (tmp_path / "measure.json").write_text(json.dumps({"mode": "MEASURE", "dump_stats_path": str(tmp_path / "m")}))
        config = FP8Config.from_json_file(str(tmp_path / "measure.json"))
        assert config.measure and config.measure_file == tmp_path / "m_hooks_maxabs.json"  # observer maxabs by default
        model = torch.nn.Sequential(torch.nn.Linear(2, 2))
        finalize_calibration(prepare(model, config))
        assert (tmp_path / "m_hooks_maxabs.json").is_file()
        quant = FP8Config.from_dict({"dump_stats_path": str(tmp_path / "m")})  # mode defaults to QUANTIZE
        assert not quant.measure
        convert(model, quant)
        monkeypatch.setenv("LOCAL_RANK", "1")
        monkeypatch.setenv("WORLD_SIZE", "2")
        ranked = FP8Config.from_dict({"dump_stats_path": str(tmp_path / "m")})  # the rank is fixed when parsed
        assert ranked.measure_file == tmp_path / "m_hooks_maxabs_1_2.json"
        with pytest.raises(FileNotFoundError, match="m_hooks_maxabs_1_2.json"):
            convert(model, ranked)


def test_swapping_in_the_fake_leaves_inspect_able_to_find_a_new_modules_source(make_fake_gaudi):
    """The suite swaps the emulated habana_frameworks (a file) for the fake's (a namespace package, like Habana's):
    inspect.getmodule, which torch calls when it first registers a custom op (e.g. during a torch.compile trace),
    must not then fail on the name's cached file ("is a built-in module")."""
    import inspect

    import habana_frameworks.torch.core  # the emulated package, found first here

    inspect.getmodule(sys._getframe(), "/nowhere/before.py")  # caches every loaded module's __file__
    make_fake_gaudi()
    import habana_frameworks

    assert getattr(habana_frameworks, "__file__", None) is None
    inspect.getmodule(sys._getframe(), "/nowhere/after.py")
