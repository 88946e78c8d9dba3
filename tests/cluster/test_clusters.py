"""Beyond one machine, with the launchers Gaudi clusters use: Open MPI's mpirun, SLURM's srun and Ray Train.

Two emulated cards on localhost; every rank must train on `hpu`, in a process group over "hccl", to the same final
weights (a digest of them per rank, tests/cluster/ranks.py), and with the launcher's cluster environment in
Lightning. The README's "Clusters" section shows these commands. Only `make test-cluster` runs this folder
(tests/cluster/conftest.py): it installs Open MPI, SLURM and munge (.ci/install_cluster.sh) and runs pytest from
.venv-cluster (the `cluster` extra: mpi4py, ray[train]).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.cluster.slurm import SingleNodeSlurm

pytestmark = pytest.mark.cluster

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
RANKS = HERE / "ranks.py"
CARDS = 2
# What a rank must not inherit from the test's process: a launcher's or an earlier test's ranks and cards.
INHERITED = ("HPU_NB_BACKEND", "HABANA_VISIBLE_MODULES", "HLS_MODULE_ID", "WORLD_SIZE", "RANK", "LOCAL_RANK",
             "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "PT_HPU_LAZY_MODE")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in INHERITED and not k.startswith(("OMPI_", "SLURM_"))}
    return {**env, "PYTHONPATH": str(ROOT), "MASTER_PORT": str(_free_port()), **extra}


def _run(command: list[str], env: dict[str, str], timeout: float = 150) -> subprocess.CompletedProcess:
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=str(ROOT), timeout=timeout,
                            check=False)
    assert result.returncode == 0, f"{' '.join(command)}\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    return result


def _ranks(out: Path, environment: str | None) -> list[dict]:
    reports = [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]
    assert [r["rank"] for r in reports] == list(range(CARDS))
    for r in reports:
        assert r["world_size"] == CARDS and r["backend"] == "hccl" and r["device"] == "hpu", r
        assert r["environment"] == environment, r
    assert sorted(r["local_rank"] for r in reports) == list(range(CARDS))
    assert sorted(r["module_id"] for r in reports) == [str(i) for i in range(CARDS)]  # one card each
    assert len({r["digest"] for r in reports}) == 1, "the ranks' final weights differ"
    return reports


# -- Open MPI -------------------------------------------------------------------------------------------------------

def mpirun_command(*args: str) -> list[str]:
    """Habana's binding flags (its examples: --bind-to core --map-by socket:PE=6 --rank-by core for 8 cards), with
    the cores each rank gets here: one."""
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    return ["mpirun", *root, "-n", str(CARDS), "--bind-to", "core", "--map-by", "socket:PE=1", "--rank-by", "core",
            "-x", "MASTER_PORT", "-x", "PYTHONPATH", sys.executable, str(RANKS), *args]


@pytest.mark.timeout(180)
def test_mpirun_trains_a_lightning_trainer_with_hpu_ddp(tmp_path):
    _run(mpirun_command("lightning", str(tmp_path), str(CARDS)), _env())
    _ranks(tmp_path, "MPIEnvironment")


@pytest.mark.timeout(180)
def test_mpirun_runs_habana_s_plain_torch_pattern(tmp_path):
    _run(mpirun_command("torch", str(tmp_path)), _env())
    _ranks(tmp_path, None)


# -- SLURM ----------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    with SingleNodeSlurm(tmp_path_factory.mktemp("slurm"), cpus=2 * CARDS) as cluster:
        yield cluster


@pytest.mark.timeout(240)
def test_srun_with_ntasks_per_node_trains_a_lightning_trainer(slurm, tmp_path):
    env = {**slurm.env(), **_env()}
    command = ["srun", "--nodes=1", f"--ntasks-per-node={CARDS}", sys.executable, str(RANKS), "lightning",
               str(tmp_path), str(CARDS)]
    _run(command, env)
    _ranks(tmp_path, "SLURMEnvironment")


@pytest.mark.timeout(120)
def test_srun_with_ntasks_alone_is_refused_by_lightning_naming_ntasks_per_node(slurm, tmp_path):
    """What the README says of `--ntasks`: Lightning's SLURMEnvironment refuses it, on every rank, before training."""
    command = ["srun", "--ntasks=2", sys.executable, str(RANKS), "lightning", str(tmp_path), str(CARDS)]
    result = subprocess.run(command, capture_output=True, text=True, env={**slurm.env(), **_env()}, cwd=str(ROOT),
                            timeout=100, check=False)
    assert result.returncode != 0
    assert "Use `--ntasks-per-node=2` instead" in result.stderr
    assert not list(tmp_path.glob("rank*.json"))


# -- Ray Train ------------------------------------------------------------------------------------------------------

RAY_NOSET = "RAY_EXPERIMENTAL_NOSET_HABANA_VISIBLE_MODULES"


def test_ray_narrowing_each_worker_to_its_own_card_is_habana_s_clear_error(monkeypatch):
    """Ray's HPU accelerator manager sets a worker's HABANA_VISIBLE_MODULES to its own card; Habana's HCCL then
    binds local rank 1 to the second visible module, which is not there: an AssertionError in Habana's bridge too.
    Ours names Ray's switch. With the switch, Ray leaves the variable alone and rank 1 binds card 1."""
    import habana_frameworks.torch.distributed.hccl as hccl
    from ray._private.accelerators.hpu import HPUAcceleratorManager

    for name in ("HABANA_VISIBLE_MODULES", "HLS_MODULE_ID", RAY_NOSET):
        monkeypatch.delenv(name, raising=False)
    HPUAcceleratorManager.set_current_process_visible_accelerator_ids(["1"])  # what Ray does in worker 1
    assert os.environ["HABANA_VISIBLE_MODULES"] == "1"
    with pytest.raises(AssertionError, match=f"local rank 1 but HABANA_VISIBLE_MODULES='1'.*{RAY_NOSET}=1") as raised:
        hccl.initialize_distributed_hpu(world_size=2, rank=1, local_rank=1)
    assert str(raised.value).startswith("There is not enough devices\n        available for training. Please verify if "
                                        "HABANA_VISIBLE_MODULES\n        is set correctly.")  # Habana's words first
    assert "HLS_MODULE_ID" not in os.environ

    monkeypatch.delenv("HABANA_VISIBLE_MODULES")
    monkeypatch.setenv(RAY_NOSET, "1")
    HPUAcceleratorManager.set_current_process_visible_accelerator_ids(["1"])
    assert "HABANA_VISIBLE_MODULES" not in os.environ
    assert hccl.initialize_distributed_hpu(world_size=2, rank=1, local_rank=1) == (2, 1, 1)
    assert os.environ["HLS_MODULE_ID"] == "1"


def test_ray_s_prepare_trainer_refuses_the_hpu_strategies_as_the_readme_says():
    """prepare_trainer accepts only Ray's own strategy classes; the supported combination (README) leaves it out."""
    import lightning as L
    from ray.train.lightning import prepare_trainer

    import hpu_nb  # noqa: F401  (registers "hpu" with Lightning)

    trainer = L.Trainer(accelerator="hpu", devices=1, strategy="hpu_ddp", logger=False, enable_progress_bar=False)
    with pytest.raises(RuntimeError, match="Invalid strategy class.*HPUDDPStrategy.*RayDDPStrategy"):
        prepare_trainer(trainer)


def _ray(mode: str, out: Path) -> dict:
    # Ray's session folder of its own (its default, /tmp/ray, is shared by every Ray on the machine), with a short
    # path: Ray's Unix sockets live there, and a socket's path has at most 107 characters.
    session = tempfile.mkdtemp(prefix="hpunb-ray-", dir="/tmp")
    try:
        env = _env(**{RAY_NOSET: "1", "RAY_TMPDIR": session, "RAY_USAGE_STATS_ENABLED": "0"})
        _run([sys.executable, str(RANKS), f"ray-{mode}", str(out)], env, timeout=200)
    finally:
        shutil.rmtree(session, ignore_errors=True)
    return json.loads((out / "ray_result.json").read_text())


@pytest.mark.timeout(240)
def test_ray_torch_trainer_with_one_hpu_per_worker_trains_over_hccl(tmp_path):
    _ray("torch", tmp_path)
    reports = _ranks(tmp_path, None)
    assert {r["ray_device"] for r in reports} == {"hpu"}  # ray.train.torch.get_device()


@pytest.mark.timeout(240)
def test_ray_runs_a_lightning_trainer_with_hpu_ddp_and_ray_s_report_callback(tmp_path):
    result = _ray("lightning", tmp_path)
    _ranks(tmp_path, "RayLightningEnvironment")
    assert result["metrics"]["step"] == 6 and result["metrics"]["loss"] > 0  # reported by RayTrainReportCallback
    assert (Path(result["checkpoint"]) / "checkpoint.ckpt").is_file()  # and its checkpoint, kept by Ray


def test_the_launchers_are_installed():
    """make test-cluster installs them (.ci/install_cluster.sh); a missing one is a set-up error, never a skip."""
    assert all(shutil.which(tool) for tool in ("mpirun", "srun", "slurmctld", "slurmd", "munged", "mungekey"))
