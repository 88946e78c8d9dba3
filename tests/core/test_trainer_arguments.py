"""Trainer arguments refused or honoured when the Trainer is built, as Lightning users expect (reliability round 3)."""

from __future__ import annotations

import lightning as L
import pytest

from hpu_nb.runtime import get_backend


def test_a_bad_execution_mode_is_refused_when_the_trainer_is_built(monkeypatch):
    """It used to pass Trainer() and fail only once fit() started."""
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "garbage")
    with pytest.raises(ValueError, match="PT_HPU_LAZY_MODE='garbage' is not a Gaudi execution mode"):
        L.Trainer(accelerator="hpu", devices=1, logger=False)


@pytest.mark.parametrize("devices", [-1, "-1"])
def test_devices_minus_one_means_every_card(monkeypatch, devices):
    """Lightning's -1 is all devices; "auto" stays one emulated card unless HPU_NB_DEVICE_COUNT says more."""
    monkeypatch.delenv("HPU_NB_DEVICE_COUNT", raising=False)
    monkeypatch.delenv("HABANA_VISIBLE_MODULES", raising=False)
    trainer = L.Trainer(accelerator="hpu", devices=devices, logger=False)
    assert trainer.num_devices == get_backend().device_count() > 1
    assert L.Trainer(accelerator="hpu", devices="auto", logger=False).num_devices == get_backend().auto_device_count()
