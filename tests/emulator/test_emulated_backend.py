"""The emulated Gaudi backend: selection, generations, limits, and that it drives the device through Habana's API."""

from __future__ import annotations

import pytest
import torch

import hpu_nb.runtime as runtime
from hpu_nb.emulator import hpu_device
from hpu_nb.emulator.backend import EmulatedBackend
from hpu_nb.runtime import GENERATIONS, MEMORY_STAT_KEYS, HPUNotAvailableError
from hpu_nb.runtime.env import format_bytes, parse_size


def test_auto_picks_emulated_without_gaudi():
    backend = runtime.get_backend()
    assert backend.name == "emulated" and backend.is_emulated
    assert backend.autocast_device_type == "hpu" and backend.dist_backend == "hccl"
    assert backend.root_device() == torch.device("hpu", 0)
    assert "emulated" in backend.describe()
    assert runtime.get_backend() is backend  # chosen once


def test_forcing_gaudi_without_one_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("HPU_NB_BACKEND", "gaudi")
    with pytest.raises(HPUNotAvailableError, match="HPU_NB_BACKEND=gaudi.*habana_frameworks"):
        runtime.get_backend()


def test_bad_backend_name(monkeypatch):
    monkeypatch.setenv("HPU_NB_BACKEND", "tpu")
    with pytest.raises(ValueError, match="auto, gaudi, emulated"):
        runtime.get_backend()


@pytest.mark.parametrize("key", sorted(GENERATIONS))
def test_generation_sets_limit_and_features(monkeypatch, key):
    monkeypatch.setenv("HPU_NB_DEVICE", key)
    backend = runtime.get_backend()
    gen = GENERATIONS[key]
    assert backend.device_name() == gen.device_name == torch.hpu.get_device_name()
    assert backend.memory_stats()["Limit"] == gen.hbm_bytes == torch.hpu.memory_stats()["Limit"]
    assert gen.supports_fp8 == (key != "gaudi")


def test_default_generation_is_gaudi2_with_96_gib():
    assert runtime.get_backend().memory_stats()["Limit"] == 96 * 2**30


def test_unknown_generation(monkeypatch):
    monkeypatch.setenv("HPU_NB_DEVICE", "gaudi9")
    with pytest.raises(ValueError, match="gaudi, gaudi2, gaudi3"):
        runtime.get_backend()


@pytest.mark.parametrize(
    "text,expected",
    [("512MiB", 512 * 2**20), ("2GiB", 2 * 2**30), ("1.5 GB", 1_500_000_000), ("1048576", 2**20), ("64kib", 65536)],
)
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["lots", "12 parsecs", "-1GiB", "0"])
def test_parse_size_rejects(text):
    with pytest.raises(ValueError):
        parse_size(text)


def test_memory_limit_env_is_checked(monkeypatch):
    monkeypatch.setenv("HPU_NB_MEMORY_LIMIT", "plenty")
    with pytest.raises(ValueError, match="HPU_NB_MEMORY_LIMIT"):
        runtime.get_backend()


def test_memory_limit_above_the_cards_hbm_is_refused(monkeypatch):
    monkeypatch.setenv("HPU_NB_MEMORY_LIMIT", "200GiB")
    with pytest.raises(ValueError, match="96 GiB of HBM"):
        runtime.get_backend()


@pytest.mark.parametrize("count", ["0", "1000000", "many"])
def test_device_count_env_is_checked(monkeypatch, count):
    monkeypatch.setenv("HPU_NB_DEVICE_COUNT", count)
    with pytest.raises(ValueError, match="HPU_NB_DEVICE_COUNT"):
        runtime.get_backend()


def test_memory_limit_set_in_a_running_process_takes_effect_where_it_is_shown(monkeypatch):
    runtime.get_backend()
    monkeypatch.setenv("HPU_NB_MEMORY_LIMIT", "1GiB")
    runtime.reset_backend()  # what a new backend (e.g. %hpu_info's) reads
    backend = runtime.get_backend()
    assert backend.memory_stats()["Limit"] == 2**30 == torch.hpu.mem_get_info()[1]
    assert backend.device_facts()[0].memory_total == 2**30


def test_format_bytes():
    assert format_bytes(512) == "512 B"
    assert format_bytes(1536) == "1.50 KiB"
    assert format_bytes(3 * 2**30) == "3.00 GiB"


def test_backend_reads_the_devices_counters():
    backend = EmulatedBackend(memory_limit="1GiB")
    hpu_device.fresh_card()
    weight = torch.zeros(256, 256, device="hpu")
    stats = backend.memory_stats()
    assert set(stats) == set(MEMORY_STAT_KEYS)
    assert stats["InUse"] == 256 * 256 * 4 and stats["NumAllocs"] == 1
    del weight
    assert backend.memory_stats()["InUse"] == 0


def test_mark_step_is_habanas_no_op_in_eager_mode_and_counted_in_lazy_mode(monkeypatch):
    import habana_frameworks.torch.core as htcore

    backend = EmulatedBackend()
    before = htcore.placed_mark_steps
    assert not backend.is_lazy()  # today's Gaudi software runs eager by default
    backend.mark_step()
    assert htcore.placed_mark_steps == before
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "1")
    assert backend.is_lazy()
    backend.mark_step()
    backend.mark_step()
    assert htcore.placed_mark_steps == before + 2


@pytest.mark.parametrize("value", ["2", "off", "FALSE", "-1", "true"])
def test_lazy_mode_values_other_than_0_and_1_are_errors(monkeypatch, value):
    monkeypatch.setenv("PT_HPU_LAZY_MODE", value)
    with pytest.raises(ValueError, match=f"PT_HPU_LAZY_MODE={value!r}.*0.*1"):
        runtime.get_backend().is_lazy()


def test_device_facts_say_emulated():
    facts = EmulatedBackend(device_count=2).device_facts()
    assert [f.index for f in facts] == [0, 1]
    assert all("emulated" in f.name and f.source == "emulated" for f in facts)


def test_settings_changed_after_the_card_started_are_reported_not_silently_shown(monkeypatch):
    from hpu_nb.runtime.info import collect_info

    backend = runtime.get_backend()
    monkeypatch.setenv("HPU_NB_MEMORY_LIMIT", "1GiB")  # a running kernel: the card keeps its Limit
    assert backend.memory_stats()["Limit"] == 96 * 2**30
    info = collect_info(backend)
    assert info.devices[0].memory_total == 96 * 2**30
    assert any("HPU_NB_MEMORY_LIMIT was changed after the emulated card started and is not in force" in p
               and "1073741824" in p for p in info.problems)
