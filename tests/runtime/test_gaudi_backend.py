"""The Gaudi backend against the fake habana_frameworks: what we ask of Habana, and how we degrade."""

from __future__ import annotations

import datetime
import os

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
def test_selecting_and_describing_the_gaudi_acquires_no_card(make_fake_gaudi) -> None:  # noqa: F811
    """probe, generation, name, count, fp16 / fp8 support: all read without acquiring a card (a launcher must not)."""
    fake = make_fake_gaudi(device_name="GAUDI3", device_count=4)
    backend = get_backend()
    assert backend.describe() == "Intel Gaudi: 4 x GAUDI3" and backend.generation().key == "gaudi3"
    assert backend.fp8_support() == (True, "") and backend.device_name() == "GAUDI3"
    assert fake.acquisitions() == [] and not backend.device_acquired()
    assert fake.calls.count("get_device_name") == 0 and fake.calls.count("_get_device_type") >= 1
    backend.memory_stats()  # using the device does acquire this process's card
    assert [a["pid"] for a in fake.acquisitions()] == [os.getpid()] and backend.device_acquired()


def test_generation_without_habanas_device_type_comes_from_the_machine_tools(make_fake_gaudi, fake_hlsmi,  # noqa: F811
                                                                             monkeypatch) -> None:
    fake = make_fake_gaudi(device_name="GAUDI3")
    fake_hlsmi.generation = "gaudi3"
    fake_hlsmi.write()
    import habana_frameworks.torch.utils.experimental as htexp

    monkeypatch.delattr(htexp, "_get_device_type")  # an older release, or a driver that cannot say
    assert get_backend().generation().key == "gaudi3"
    assert fake.acquisitions() == [] and fake_hlsmi.invocations()[0][0] == "-Q"


def test_release_decides_lazy_mode_and_mark_step_placement() -> None:
    for release, lazy in (("1.18.0", True), ("1.21.0", False)):
        with install_fake_habana(release=release) as fake:
            backend = get_backend()
            fake.calls.clear()
            for _ in range(3):
                backend.mark_step()
            assert backend.is_lazy() is lazy and str(backend.release()) == release[:4]
            assert fake.calls.count("core.mark_step") == (3 if lazy else 0)
            assert fake.calls.count("is_lazy") >= 3  # Habana decides, not us


@pytest.mark.parametrize("value", ["false", "2", "off", "-1"])
def test_a_lazy_mode_other_than_0_or_1_is_refused_on_a_gaudi(make_fake_gaudi, monkeypatch, value) -> None:  # noqa: F811
    monkeypatch.setenv("PT_HPU_LAZY_MODE", value)
    make_fake_gaudi(release="1.21.0")
    with pytest.raises(ValueError, match=rf"PT_HPU_LAZY_MODE='{value}' is not a Gaudi execution mode"):
        get_backend()


def test_first_generation_gaudi_with_a_release_that_dropped_it_is_refused(make_fake_gaudi) -> None:  # noqa: F811
    fake = make_fake_gaudi(backend=None, device_name="GAUDI", release="1.22.0")
    found, reason = probe_gaudi()
    assert not found and "no longer supports first-generation Gaudi" in reason and fake.acquisitions() == []


def test_memory_stats_come_from_habana_for_the_device(make_fake_gaudi) -> None:  # noqa: F811
    from hpu_nb.emulator import hpu_device

    fake = make_fake_gaudi(device_count=2, memory_limit=1000 * MiB)
    backend = get_backend()
    backend.synchronize()
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


def test_generation_comes_from_habanas_device_type(make_fake_gaudi) -> None:  # noqa: F811
    make_fake_gaudi(device_name="GAUDI", release="1.21.0")
    generation = get_backend().generation()
    assert (generation.key, generation.supports_fp16, generation.supports_fp8) == ("gaudi", False, False)


def test_synchronize_and_metrics_go_to_habana(fake_gaudi: FakeHabana) -> None:  # noqa: F811
    backend = get_backend()
    backend.synchronize()
    assert fake_gaudi.calls.count("hpu.synchronize") == 1
    fake_gaudi.set_metric("graph_compilation", TotalNumber=7, TotalTime=1234)
    metrics = backend.metrics(("graph_compilation", "recipe_cache", "no_such_metric"))
    assert metrics == {"graph_compilation": {"TotalNumber": 7, "TotalTime": 1234, "AvgTime": 0}}  # None: left out


def test_old_op_list_variables_warn_once_naming_the_new_ones(make_fake_gaudi, tmp_path, monkeypatch) -> None:  # noqa: F811
    (tmp_path / "ops.txt").write_text("exp\n")
    monkeypatch.setenv("LOWER_LIST", str(tmp_path / "ops.txt"))
    make_fake_gaudi(release="1.21.0")
    with pytest.warns(UserWarning, match="LOWER_LIST is not read by Gaudi software 1.21 .*"
                                         "PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST") as record:
        get_backend()
    assert len([w for w in record if "LOWER_LIST" in str(w.message)]) == 1


# -- versions and device facts -------------------------------------------------------------------------------
def test_versions_from_hl_smi_are_read_once(fake_gaudi: FakeHabana, fake_hlsmi: FakeHlSmi) -> None:  # noqa: F811
    backend = get_backend()
    assert fake_hlsmi.invocations() == []  # nothing runs until asked
    versions = backend.versions()
    assert (versions.habana_frameworks, versions.synapseai, versions.firmware, versions.driver) == (
        "1.22.0", "1.17.2", "51.5.1.0", "1.17.2-4ab2e36")  # the plugin distribution; hl-smi for the rest
    assert versions.torch == torch.__version__ and versions.extra == {}
    assert backend.versions() is versions
    assert fake_hlsmi.invocations() == [["-v"], ["-L"]]


@pytest.mark.parametrize("mode", ["missing", "failing", "hanging", "garbage"])
def test_versions_degrade_without_a_working_hl_smi(fake_gaudi, fake_hlsmi, mode) -> None:  # noqa: F811
    fake_hlsmi.mode = mode
    runtime.set_backend(GaudiBackend(facts_timeout=0.5))
    versions = get_backend().versions()  # a hanging hl-smi never answers: only its timeout lets this return
    assert versions.habana_frameworks == "1.22.0" and versions.synapseai == "1.22.0"  # from the plugin version
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
    from hpu_nb.emulator import hpu_device

    fake = make_fake_gaudi(device_count=3)
    fake_hlsmi.mode = mode
    backend = get_backend()
    facts = backend.device_facts(timeout=0.5)  # a hanging hl-smi never answers: only its timeout lets this return
    assert [(f.index, f.name, f.source) for f in facts] == [(i, "GAUDI2", "runtime") for i in range(3)]
    assert facts[0].memory_total is None and fake.acquisitions() == []  # reading memory would acquire a card
    backend._facts = None
    backend.synchronize()  # this process now holds its card: its memory is known
    hpu_device.fresh_card()
    held = torch.empty(64 * MiB, dtype=torch.uint8, device="hpu")  # noqa: F841 (on this process's card)
    facts = backend.device_facts(timeout=0.5)
    assert (facts[0].memory_total, facts[0].memory_used) == (fake.config.limit(), 64 * MiB)
    assert facts[1].memory_total is None  # only this process's card is known to the runtime
    assert backend.facts_reasons["hl-smi"]
    runs = len(fake_hlsmi.invocations())
    monkeypatch.setattr(gaudi, "FACTS_TTL_S", 0.0)  # no cached facts: a failed source is still not asked again
    assert backend.device_facts(timeout=0.5)[0].source == "runtime"
    assert len(fake_hlsmi.invocations()) == runs


def test_hanging_pyhlml_is_abandoned_at_the_timeout(make_fake_gaudi, fake_hlsmi) -> None:  # noqa: F811
    fake = make_fake_gaudi(pyhlml=True)
    fake.pyhlml.DELAY_S = 3600.0  # it would outlive the test's own timeout if it were waited for
    facts = get_backend().device_facts(timeout=0.3)
    assert facts[0].source == "hl-smi"
    assert "did not answer within 0.3 s" in get_backend().facts_reasons["pyhlml"]


def test_emulated_hccl_moves_fp8_tensors_exactly() -> None:
    """DDP broadcasts every buffer, fp8 ones included (an fp8-quantized model): HCCL moves them as they are."""
    import torch.distributed as dist

    from hpu_nb.emulator.hpu_device import hccl

    get_backend()
    hccl.register()
    dist.init_process_group("hccl", store=dist.HashStore(), rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=20))
    try:
        value = torch.tensor([0.5, -3.0, 448.0]).to(torch.float8_e4m3fn).to("hpu")
        dist.broadcast(value, src=0)
        gathered = [torch.empty_like(value)]
        dist.all_gather(gathered, value)
        assert gathered[0].dtype == torch.float8_e4m3fn and gathered[0].float().cpu().tolist() == [0.5, -3.0, 448.0]
    finally:
        dist.destroy_process_group()
