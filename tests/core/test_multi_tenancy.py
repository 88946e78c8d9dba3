"""Multi-tenancy: several jobs on one machine, each with its own HABANA_VISIBLE_MODULES and MASTER_PORT.

Rewritten from lightning-habana's test_multi_tenancy and examples/pytorch/multi_tenants.sh: tenants training at the
same time with HPUDDPStrategy(start_method="spawn") each get their own cards and finish; a job asking for more cards
than it was given fails with a clear error instead of training anyway.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
from lightning.fabric.plugins.environments.lightning import find_free_network_port
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from hpu_nb import HPUAccelerator, HPUDDPStrategy
from hpu_nb.runtime import get_backend
from tests.fake_habana.fixture import make_fake_gaudi  # noqa: F401

ROOT = Path(__file__).resolve().parents[2]
FIT = ROOT / "tests" / "dist_scripts" / "fit.py"


def start_tenant(out: Path, modules: str, port: int, devices: int = 2) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HPU_NB_", "PT_HPU", "HLS_", "MASTER_"))}
    env.update(PYTHONPATH=str(ROOT), HABANA_VISIBLE_MODULES=modules, MASTER_PORT=str(port))
    out.mkdir(parents=True)
    return subprocess.Popen([sys.executable, str(FIT), "--out", str(out), "--devices", str(devices), "--strategy",
                             "spawn"], env=env, cwd=str(out), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


@pytest.mark.timeout(280)
def test_two_tenants_train_at_the_same_time_on_their_own_cards(tmp_path):
    ports = [find_free_network_port(), find_free_network_port()]
    tenants = {"0,1": tmp_path / "tenant_a", "2,3": tmp_path / "tenant_b"}
    jobs = [start_tenant(out, modules, port) for (modules, out), port in zip(tenants.items(), ports)]
    for job in jobs:
        _, stderr = job.communicate(timeout=250)
        assert job.returncode == 0, stderr[-3000:]
    for (modules, out), port in zip(tenants.items(), ports):
        workers = [json.loads(p.read_text()) for p in sorted(out.glob("worker*.json"))]
        assert [w["rank"] for w in workers] == [0, 1]
        assert [w["module_id"] for w in workers] == modules.split(",")  # rank r took the tenant's r-th card
        assert {w["master_port"] for w in workers} == {str(port)}  # its own rendezvous
        assert [w["samples_seen"] for w in workers] == [32, 32] and {w["device"] for w in workers} == {"hpu:0"}
        (parent,) = [json.loads(p.read_text()) for p in out.glob("rank*.json")]
        assert parent["strategy"] == "HPUDDPStrategy" and parent["metrics"]["rank_sum"] == 3.0
        assert len({w["pid"] for w in workers} | {parent["pid"]}) == 3  # spawned workers, not the launcher


def test_a_tenant_asking_for_more_cards_than_it_was_given_fails_clearly(monkeypatch):
    monkeypatch.setenv("HABANA_VISIBLE_MODULES", " 0, 1")
    assert get_backend().device_count() == 2 and HPUAccelerator.auto_device_count() == 2
    assert get_backend().describe() == "emulated Gaudi on the CPU: 2 x GAUDI2 (HABANA_VISIBLE_MODULES=0,1)"
    with pytest.raises(MisconfigurationException, match=r"asks for 4 HPUs but only 2.*HABANA_VISIBLE_MODULES=0,1")\
            as refused:
        L.Trainer(accelerator=HPUAccelerator(), devices=4, strategy=HPUDDPStrategy(start_method="spawn"))
    # the hint names the tenant's variable, not the emulation's card count (which the tenant does not control)
    assert "list more there" in str(refused.value) and "HPU_NB_DEVICE_COUNT" not in str(refused.value)


def test_on_a_gaudi_a_tenant_is_pointed_at_its_visible_modules(make_fake_gaudi, monkeypatch):  # noqa: F811
    make_fake_gaudi(device_count=8)
    monkeypatch.setenv("HABANA_VISIBLE_MODULES", "2,3")
    with pytest.raises(MisconfigurationException, match=r"asks for 3 HPUs but only 2.*list more there"):
        HPUAccelerator.parse_devices(3)


def test_visible_modules_must_exist_on_the_machine(monkeypatch):
    monkeypatch.setenv("HABANA_VISIBLE_MODULES", "6,7,8")
    with pytest.raises(ValueError, match=r"HABANA_VISIBLE_MODULES='6,7,8' names cards \[8\].*cards 0-7"):
        get_backend().device_count()


@pytest.mark.parametrize("listed", [" , ", ",", " "])
def test_an_empty_list_of_visible_modules_means_every_card(monkeypatch, listed):
    """Only separators used to mean no card at all, with advice to set HPU_NB_DEVICE_COUNT."""
    monkeypatch.setenv("HABANA_VISIBLE_MODULES", listed)
    assert get_backend().device_count() == get_backend().card.device_count


def test_spawn_start_method_is_kept(monkeypatch):
    monkeypatch.setenv("HABANA_VISIBLE_MODULES", "4,5")
    trainer = L.Trainer(accelerator="hpu", devices=2, strategy=HPUDDPStrategy(start_method="spawn"), logger=False)
    assert trainer.strategy.launcher._start_method == "spawn" and trainer.num_devices == 2
