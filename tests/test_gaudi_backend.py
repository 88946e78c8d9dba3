"""The Gaudi backend against the fake habana_frameworks: what we ask of Habana, and how we degrade."""

from __future__ import annotations

import datetime
import importlib
import inspect
import os
import sys
import time
from pathlib import Path

import pytest
import torch

import hpu_nb.runtime as runtime
from hpu_nb.runtime import HPUNotAvailableError, gaudi, get_backend
from hpu_nb.runtime.base import MEMORY_STAT_KEYS
from hpu_nb.runtime.gaudi import GaudiBackend, probe_gaudi
from tests.fake_habana import FakeHabana, install_fake_habana
from tests.fake_habana.fixture import fake_gaudi, fake_hlsmi, make_fake_gaudi, no_gaudi  # noqa: F401
from tests.fake_habana.hlsmi import FakeHlSmi

MiB = 1 << 20


# -- selection -----------------------------------------------------------------------------------------------
def test_auto_selects_gaudi_when_habana_finds_one(make_fake_gaudi) -> None:  # noqa: F811
    make_fake_gaudi(backend=None, device_count=2, device_name="GAUDI3")
    assert "HPU_NB_BACKEND" not in os.environ
    backend = get_backend()
    assert isinstance(backend, GaudiBackend)
    assert (backend.name, backend.is_emulated, backend.autocast_device_type, backend.dist_backend) == (
        "gaudi", False, "hpu", "hccl")
    assert backend.device_count() == 2 and backend.generation().key == "gaudi3"
    assert backend.root_device() == torch.device("hpu", 0) and backend.root_device(1) == torch.device("hpu", 1)
    assert backend.describe() == "Intel Gaudi: 2 x GAUDI3"


def test_auto_selects_emulated_without_habana(no_gaudi) -> None:  # noqa: F811
    found, reason = probe_gaudi()
    assert not found and "not installed" in reason
    backend = get_backend()
    assert backend.name == "emulated" and backend.is_emulated


def test_forcing_gaudi_without_one_raises_a_clear_error(no_gaudi, monkeypatch) -> None:  # noqa: F811
    monkeypatch.setenv("HPU_NB_BACKEND", "gaudi")
    expected = r"HPU_NB_BACKEND=gaudi.*habana_frameworks is not installed.*emulated"
    with pytest.raises(HPUNotAvailableError, match=expected):
        get_backend()
    with pytest.raises(HPUNotAvailableError, match="does not import here"):
        GaudiBackend()


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"available": False}, "sees no Gaudi (is_available()=False, device_count()=0)"),
        ({"device_count": 0}, "sees no Gaudi"),
        ({"import_error": "libSynapse.so: cannot open shared object file"}, "does not import (ImportError: libSynapse"),
    ],
)
def test_unusable_gaudi_software_is_a_clear_error(make_fake_gaudi, options, words) -> None:  # noqa: F811
    """Habana's software is installed but no card can be used: the emulated Gaudi cannot run beside it, and says so."""
    make_fake_gaudi(backend=None, **options)
    found, reason = probe_gaudi()
    assert not found and words in reason
    with pytest.raises(HPUNotAvailableError, match=r"installed but no Gaudi can be used here.*PT_HPU_AUTOLOAD=0"):
        get_backend()
    os.environ["HPU_NB_BACKEND"] = "gaudi"  # restored by the fixture
    runtime.reset_backend()
    with pytest.raises(HPUNotAvailableError, match="no Gaudi can be used here"):
        get_backend()


def test_probe_never_raises_when_habana_itself_fails(fake_gaudi: FakeHabana, monkeypatch) -> None:  # noqa: F811
    import habana_frameworks.torch.hpu as hthpu

    def broken() -> bool:
        raise RuntimeError("synStatus 26 [Device not found]")

    monkeypatch.setattr(hthpu, "is_available", broken)
    assert probe_gaudi() == (False, "habana_frameworks failed to query the devices (RuntimeError: synStatus 26 "
                                    "[Device not found])")


# -- what we ask of Habana -----------------------------------------------------------------------------------
def test_mark_step_runs_the_graph_in_lazy_mode(fake_gaudi: FakeHabana) -> None:  # noqa: F811
    backend = get_backend()
    fake_gaudi.calls.clear()
    for _ in range(3):
        backend.mark_step()
    steps = fake_gaudi.calls.named("habana_frameworks.torch.core.mark_step")
    assert len(steps) == 3 and all(c.args == () and c.kwargs == {} for c in steps)
    assert backend.is_lazy() and fake_gaudi.calls.count("core.is_lazy") >= 3  # Habana decides, not us


def test_mark_step_is_not_called_in_eager_mode(fake_gaudi: FakeHabana, monkeypatch) -> None:  # noqa: F811
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "0")
    backend = get_backend()
    for _ in range(3):
        backend.mark_step()
    assert not backend.is_lazy()
    assert fake_gaudi.calls.count("mark_step") == 0 and fake_gaudi.calls.count("core.is_lazy") >= 3


def test_memory_stats_come_from_habana_for_the_device(make_fake_gaudi) -> None:  # noqa: F811
    from hpu_nb.runtime import hpu_device

    fake = make_fake_gaudi(device_count=2, memory_limit=1000 * MiB)
    backend = get_backend()
    hpu_device.fresh_card()
    first = torch.empty(300 * MiB, dtype=torch.uint8, device="hpu")
    second = torch.empty(500 * MiB, dtype=torch.uint8, device="hpu")
    del first
    fake.calls.clear()
    stats = backend.memory_stats()
    assert stats == {
        "Limit": 1000 * MiB, "InUse": 500 * MiB, "MaxInUse": 800 * MiB, "NumAllocs": 2, "NumFrees": 1,
        "ActiveAllocs": 1, "MaxAllocSize": 500 * MiB, "TotalSystemAllocs": 2, "TotalSystemFrees": 1,
        "TotalActiveAllocs": 1,
    }
    assert list(stats) == list(MEMORY_STAT_KEYS) and all(type(v) is int for v in stats.values())
    asked = fake.calls.named("habana_frameworks.torch.hpu.memory_stats")
    assert [c.args for c in asked] == [(torch.device("hpu", 0),)]

    backend.reset_peak_memory_stats()
    assert fake.calls.named("reset_peak_memory_stats")[-1].args == (torch.device("hpu", 0),)
    after = backend.memory_stats()
    assert (after["MaxInUse"], after["InUse"]) == (500 * MiB, 500 * MiB)
    del second


def test_generation_comes_from_the_device_name(make_fake_gaudi) -> None:  # noqa: F811
    make_fake_gaudi(device_name="GAUDI")
    generation = get_backend().generation()
    assert (generation.key, generation.supports_fp16, generation.supports_fp8) == ("gaudi", False, False)


def test_synchronize_and_metrics_go_to_habana(fake_gaudi: FakeHabana) -> None:  # noqa: F811
    backend = get_backend()
    backend.synchronize()
    assert fake_gaudi.calls.count("hpu.synchronize") == 1
    fake_gaudi.set_metric("graph_compilation", TotalNumber=7, TotalTime=1234)
    metrics = backend.metrics(("graph_compilation", "no_such_metric"))
    assert metrics == {"graph_compilation": {"TotalNumber": 7, "TotalTime": 1234}}


# -- versions and device facts -------------------------------------------------------------------------------
def test_versions_from_hl_smi_are_read_once(fake_gaudi: FakeHabana, fake_hlsmi: FakeHlSmi) -> None:  # noqa: F811
    backend = get_backend()
    assert fake_hlsmi.invocations() == []  # nothing runs until asked
    versions = backend.versions()
    assert (versions.habana_frameworks, versions.synapseai, versions.firmware, versions.driver) == (
        "1.17.2.1", "1.17.2", "51.5.1.0", "1.17.2-4ab2e36")
    assert versions.torch == torch.__version__ and versions.extra == {}
    assert backend.versions() is versions
    assert fake_hlsmi.invocations() == [["-v"], ["-L"]]


@pytest.mark.parametrize("mode", ["missing", "failing", "hanging", "garbage"])
def test_versions_degrade_without_a_working_hl_smi(fake_gaudi, fake_hlsmi, mode) -> None:  # noqa: F811
    fake_hlsmi.mode = mode
    runtime.set_backend(GaudiBackend(facts_timeout=0.5))
    start = time.monotonic()
    versions = get_backend().versions()
    assert time.monotonic() - start < 0.5 + 1.0
    assert versions.habana_frameworks == "1.17.2.1" and versions.synapseai == "1.17.2"  # from the plugin version
    assert versions.firmware is None and versions.driver is None
    assert versions.extra["hl-smi"] and "habana_frameworks" in versions.extra["synapseai from"]
    assert fake_hlsmi.invocations() == ([] if mode == "missing" else [["-v"]])  # -L not asked after -v failed


def test_device_facts_prefer_pyhlml(make_fake_gaudi, fake_hlsmi) -> None:  # noqa: F811
    fake = make_fake_gaudi(pyhlml=True, device_count=4)
    fake.allocate(123 * MiB, index=2)
    facts = get_backend().device_facts()
    assert [f.index for f in facts] == [0, 1, 2, 3] and {f.source for f in facts} == {"pyhlml"}
    assert facts[2].name == "HL-225" and facts[2].memory_used == 123 * MiB
    assert facts[2].memory_total == fake.config.limit()
    assert (facts[0].utilization, facts[0].temperature, facts[0].power) == (37.0, 41.0, 182.0)
    assert fake.calls.count("hlmlShutdown") == 1
    assert fake_hlsmi.invocations() == []


def test_device_facts_from_hl_smi_without_pyhlml(fake_gaudi, fake_hlsmi) -> None:  # noqa: F811
    facts = get_backend().device_facts()
    assert len(facts) == 8 and {f.source for f in facts} == {"hl-smi"}
    assert facts[3].memory_total == 98304 * MiB and facts[3].power == 87.0
    assert "not usable" in get_backend().facts_reasons["pyhlml"]


@pytest.mark.parametrize("mode", ["missing", "failing", "hanging", "garbage"])
def test_device_facts_fall_back_to_the_runtime(make_fake_gaudi, fake_hlsmi, mode, monkeypatch) -> None:  # noqa: F811
    from hpu_nb.runtime import hpu_device

    fake = make_fake_gaudi(device_count=3)
    get_backend()
    hpu_device.fresh_card()
    held = torch.empty(64 * MiB, dtype=torch.uint8, device="hpu")  # noqa: F841 (on this process's card)
    fake_hlsmi.mode = mode
    backend = get_backend()
    start = time.monotonic()
    facts = backend.device_facts(timeout=0.5)
    assert time.monotonic() - start < 0.5 + 1.0
    assert [(f.index, f.name, f.source) for f in facts] == [(i, "GAUDI2", "runtime") for i in range(3)]
    assert (facts[0].memory_total, facts[0].memory_used) == (fake.config.limit(), 64 * MiB)
    assert facts[1].memory_total is None  # only this process's card is known to the runtime
    assert backend.facts_reasons["hl-smi"]
    runs = len(fake_hlsmi.invocations())
    monkeypatch.setattr(gaudi, "FACTS_TTL_S", 0.0)  # no cached facts: a failed source is still not asked again
    start = time.monotonic()
    assert backend.device_facts(timeout=0.5)[0].source == "runtime"
    assert time.monotonic() - start < 0.3 and len(fake_hlsmi.invocations()) == runs


def test_hanging_pyhlml_is_abandoned_at_the_timeout(make_fake_gaudi, fake_hlsmi) -> None:  # noqa: F811
    fake = make_fake_gaudi(pyhlml=True)
    fake.pyhlml.DELAY_S = 3.0
    start = time.monotonic()
    facts = get_backend().device_facts(timeout=0.3)
    assert time.monotonic() - start < 0.3 + 1.0
    assert facts[0].source == "hl-smi"
    assert "did not answer within 0.3 s" in get_backend().facts_reasons["pyhlml"]


# -- the fake itself keeps to the contract (habana_api.md) ---------------------------------------------------
def test_fake_modules_names_and_signatures(fake_gaudi: FakeHabana) -> None:  # noqa: F811
    import habana_frameworks.torch.core as htcore
    import habana_frameworks.torch.hpu as hthpu

    assert hthpu.hpu is hthpu and hthpu.memory_stats.__module__ == "habana_frameworks.torch.hpu"
    assert htcore.mark_step.__module__ == "habana_frameworks.torch.core"
    assert str(inspect.signature(htcore.mark_step)) == "(device_str='', sync=False)"
    assert torch.hpu is hthpu  # importing core registered the hpu device module
    assert hthpu.metrics.metric_global("cpu_fallback").stats() == [("TotalNumber", 0), ("TotalTime", 0)]
    free, total = hthpu.mem_get_info()
    assert (free, total) == (fake_gaudi.config.limit(), fake_gaudi.config.limit())
    with pytest.raises(AssertionError, match="Invalid device id 8"):
        hthpu.memory_stats("hpu:8")


def test_fake_install_is_undone(tmp_path) -> None:
    original = torch.profiler.ProfilerActivity
    torch_hpu_before = getattr(torch, "hpu", None)  # the emulated Gaudi's module, if an earlier test loaded it
    with install_fake_habana():
        import habana_frameworks.torch  # noqa: F401
        import habana_frameworks.torch.core  # noqa: F401
        import habana_frameworks.torch.distributed.hccl  # noqa: F401

        assert [a.name for a in torch.profiler.ProfilerActivity] == ["CPU", "CUDA", "HPU"]
        assert torch.profiler.ProfilerActivity.__module__ == "habana_frameworks.torch"
        assert "hccl" in torch.distributed.Backend.backend_list and os.environ["HPU_NB_BACKEND"] == "gaudi"
    assert torch.profiler.ProfilerActivity is original
    assert getattr(torch, "hpu", None) is torch_hpu_before  # the fake's module is gone, what was there is back
    assert "hccl" not in torch.distributed.Backend.backend_list and "HPU_NB_BACKEND" not in os.environ
    from hpu_nb.runtime.emulated_habana import is_emulated_module as emulated

    assert all(emulated(m) for n, m in sys.modules.items() if n.startswith("habana_frameworks") and m is not None)
    from hpu_nb.runtime.emulated_habana import is_emulated_module

    assert is_emulated_module(importlib.import_module("habana_frameworks"))  # no Gaudi software: the emulated one


def test_fake_reaches_a_child_process(make_fake_gaudi) -> None:  # noqa: F811
    import subprocess

    fake = make_fake_gaudi(device_count=2, device_name="GAUDI3")
    code = "import habana_frameworks.torch.hpu as h; print(h.device_count(), h.get_device_name(), h.__file__)"
    out = subprocess.run([sys.executable, "-c", code], env=fake.subprocess_env(), capture_output=True, text=True,
                         timeout=60, check=True).stdout.split()
    assert out[:2] == ["2", "GAUDI3"] and out[2].startswith(str(Path(__file__).parent / "fake_habana"))


def test_fake_initialize_distributed_hpu_binds_the_card(fake_gaudi: FakeHabana, monkeypatch) -> None:  # noqa: F811
    from habana_frameworks.torch.distributed.hccl import initialize_distributed_hpu

    monkeypatch.setenv("HABANA_VISIBLE_MODULES", "4,5,6,7")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert initialize_distributed_hpu(rank=2, local_rank=2) == (4, 2, 2)
    assert "import habana_frameworks.torch.distributed.hccl" in fake_gaudi.calls.names()
    (call,) = fake_gaudi.calls.named("initialize_distributed_hpu")
    assert call.kwargs == {"rank": 2, "local_rank": 2}
    assert [os.environ[k] for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "ID", "HLS_MODULE_ID")] == [
        "4", "2", "2", "2", "6"]


def test_fake_hccl_process_group_really_reduces(fake_gaudi: FakeHabana) -> None:  # noqa: F811
    import torch.distributed as dist

    import habana_frameworks.torch.distributed.hccl  # noqa: F401

    dist.init_process_group("hccl", store=dist.HashStore(), rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=20))
    try:
        assert dist.get_backend() == "hccl"
        value = torch.tensor([1.5, -2.0], device="hpu")
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        assert value.device.type == "hpu" and value.tolist() == [1.5, -2.0]
        dist.all_reduce(value, op=dist.ReduceOp.AVG)
        assert value.tolist() == [1.5, -2.0]
        with pytest.raises(RuntimeError, match="HCCL collectives take hpu tensors.*move it to the device"):
            dist.all_reduce(torch.tensor([1.0]))  # as on a Gaudi: HCCL is registered for hpu only
    finally:
        dist.destroy_process_group()


def test_fake_transformer_engine_rounds_through_fp8(fake_gaudi: FakeHabana) -> None:  # noqa: F811
    te = get_backend().transformer_engine()
    torch.manual_seed(0)
    layer = te.Linear(64, 32)
    x = torch.randn(16, 64)
    exact = torch.nn.functional.linear(x, layer.weight, layer.bias)
    assert torch.equal(layer(x), exact) and not te.fp8.FP8GlobalStateManager.is_fp8_enabled()
    recipe = te.recipe.DelayedScaling(margin=0, interval=1, fp8_format=te.recipe.Format.HYBRID)
    with te.fp8_autocast(enabled=True, fp8_recipe=recipe):
        assert te.fp8.FP8GlobalStateManager.is_fp8_enabled()
        out = layer(x)
    assert not te.fp8.FP8GlobalStateManager.is_fp8_enabled()
    assert out.dtype == torch.bfloat16
    error = ((out.float() - exact).norm() / exact.norm()).item()
    assert 1e-3 < error < 0.1  # fp8 rounding happened, and the result is still the same layer
    assert fake_gaudi.calls.count("fp8_autocast") == 1 and fake_gaudi.calls.count("Linear.__init__") == 1


def test_fake_refuses_fp8_on_first_generation_gaudi(make_fake_gaudi) -> None:  # noqa: F811
    make_fake_gaudi(device_name="GAUDI")
    te = get_backend().transformer_engine()
    with pytest.raises(RuntimeError, match="Gaudi2 or newer"):
        with te.fp8_autocast(enabled=True):
            pass
