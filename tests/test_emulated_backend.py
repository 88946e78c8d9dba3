"""The emulated Gaudi: selection, generations, limits and measured memory."""

from __future__ import annotations

import pytest
import torch

import hpu_nb.runtime as runtime
from hpu_nb.runtime import GENERATIONS, MEMORY_STAT_KEYS, HPUNotAvailableError, HPUOutOfMemoryError
from hpu_nb.runtime.emulated import EmulatedBackend
from hpu_nb.runtime.env import format_bytes, parse_size


def test_auto_picks_emulated_without_gaudi():
    backend = runtime.get_backend()
    assert backend.name == "emulated" and backend.is_emulated
    assert backend.autocast_device_type == "cpu" and backend.dist_backend == "gloo"
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
    assert backend.device_name() == gen.device_name
    assert backend.memory_stats()["Limit"] == gen.hbm_bytes
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


def test_format_bytes():
    assert format_bytes(512) == "512 B"
    assert format_bytes(1536) == "1.50 KiB"
    assert format_bytes(3 * 2**30) == "3.00 GiB"


def test_accounting_is_exact_for_registered_and_created_tensors():
    backend = EmulatedBackend(memory_limit="1GiB")
    weight = torch.zeros(256, 256)  # 256 KiB
    backend.register_on_device([weight, weight, weight[:10]])  # views and repeats count once
    stats = backend.memory_stats()
    assert stats["InUse"] == 256 * 256 * 4 and stats["NumAllocs"] == 1
    with backend.on_device():
        out = weight @ weight  # 256 KiB more
        view = out.t()  # no new storage
        assert view.shape == (256, 256)
        stats = backend.memory_stats()
        assert stats["InUse"] == 2 * 256 * 256 * 4
    del out, view
    stats = backend.memory_stats()
    assert stats["InUse"] == 256 * 256 * 4
    assert stats["MaxInUse"] == 2 * 256 * 256 * 4
    assert stats["NumFrees"] == 1 and stats["ActiveAllocs"] == 1
    assert stats["MaxAllocSize"] == 256 * 256 * 4
    assert set(stats) == set(MEMORY_STAT_KEYS)
    backend.reset_peak_memory_stats()
    assert backend.memory_stats()["MaxInUse"] == 256 * 256 * 4


def test_tensors_outside_the_device_are_not_counted():
    backend = EmulatedBackend()
    _ = torch.ones(1000) * 2  # not on the device
    assert backend.memory_stats()["InUse"] == 0


def test_backward_and_optimizer_state_are_counted():
    backend = EmulatedBackend()
    layer = torch.nn.Linear(64, 64)
    param_bytes = sum(p.numel() * 4 for p in layer.parameters())
    backend.register_on_device(layer.parameters())
    opt = torch.optim.Adam(layer.parameters())
    with backend.on_device():
        layer(torch.randn(8, 64)).sum().backward()
        grads_live = backend.memory_stats()["InUse"]
        opt.step()
        after_step = backend.memory_stats()["InUse"]
    assert grads_live >= 2 * param_bytes  # parameters + gradients
    assert after_step >= 4 * param_bytes  # + Adam's exp_avg and exp_avg_sq


def test_out_of_memory_names_limit_and_request():
    backend = EmulatedBackend(memory_limit="1MiB")
    with pytest.raises(HPUOutOfMemoryError, match=r"tried to allocate 4\.00 MiB \(4194304 bytes\).*Limit is 1\.00 MiB"):
        backend.register_on_device([torch.zeros(1024, 1024)])
    with backend.on_device(), pytest.raises(HPUOutOfMemoryError):
        torch.zeros(1024, 1024) + 1
    assert backend.memory_stats()["InUse"] == 0  # the failed allocation is not held


def test_mark_step_is_counted_not_executed():
    backend = EmulatedBackend()
    backend.mark_step()
    backend.mark_step()
    assert backend.mark_step_calls == 2


def test_lazy_mode_follows_env(monkeypatch):
    assert runtime.get_backend().is_lazy()
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "0")
    assert not runtime.get_backend().is_lazy()


def test_device_facts_say_emulated():
    facts = EmulatedBackend(device_count=2).device_facts()
    assert [f.index for f in facts] == [0, 1]
    assert all("emulated" in f.name and f.source == "emulated" for f in facts)
