"""A real single-node SLURM for the tests: munged, slurmctld and slurmd on 127.0.0.1, each from Debian's packages
(.ci/install_cluster.sh), with a configuration, key, state and logs of its own in one folder, so it neither needs nor
touches a system SLURM. `srun` finds it through SLURM_CONF.

    with SingleNodeSlurm(folder, cpus=4) as slurm:
        subprocess.run(["srun", "--ntasks-per-node=2", ...], env=slurm.env())
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class SingleNodeSlurm:
    """One node (this machine, by its short host name, at 127.0.0.1) in one partition, as root: what `srun` needs."""

    def __init__(self, folder: Path, cpus: int = 4) -> None:
        self.folder, self.cpus = folder, cpus
        self.node = socket.gethostname().split(".")[0]
        self.processes: list[subprocess.Popen] = []

    # -- configuration ----------------------------------------------------------------------------------------------
    def _write_configuration(self) -> None:
        d = self.folder
        for sub in ("state", "spool"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        d.chmod(0o700)  # munged refuses a socket folder that others may write
        # SlurmdParameters=config_overrides: the node has the CPUs written here (ranks are processes, not cores).
        (d / "slurm.conf").write_text(f"""\
ClusterName=hpunb
SlurmctldHost={self.node}(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={d}/munge.socket
SlurmUser=root
SlurmdUser=root
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
ProctrackType=proctrack/pgid
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
SlurmdParameters=config_overrides
ReturnToService=2
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
NodeName={self.node} NodeAddr=127.0.0.1 CPUs={self.cpus} State=UNKNOWN
PartitionName=main Nodes={self.node} Default=YES MaxTime=INFINITE State=UP
""")
        subprocess.run(["mungekey", "--create", "--force", "--keyfile", str(d / "munge.key")], check=True)
        (d / "munge.key").chmod(0o600)

    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.folder / "slurm.conf")}

    # -- daemons ----------------------------------------------------------------------------------------------------
    def _start(self, name: str, *args: str) -> None:
        log = open(self.folder / f"{name}.out", "w")  # noqa: SIM115  (kept open for the daemon's life)
        self.processes.append(subprocess.Popen([name, *args], stdout=log, stderr=subprocess.STDOUT, env=self.env(),
                                               start_new_session=True))

    def _node_idle(self) -> bool:
        result = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], capture_output=True, text=True, env=self.env(),
                                check=False, timeout=20)
        return result.returncode == 0 and result.stdout.strip().rstrip("*") == "idle"

    def __enter__(self) -> SingleNodeSlurm:
        self._write_configuration()
        d = self.folder
        self._start("munged", "--foreground", "--force", f"--socket={d}/munge.socket", f"--key-file={d}/munge.key",
                    f"--pid-file={d}/munged.pid", f"--log-file={d}/munged.log", f"--seed-file={d}/munged.seed")
        self._wait(lambda: (d / "munge.socket").exists(), "munged")
        self._start("slurmctld", "-D", "-i")  # -i: no state from an earlier run
        self._start("slurmd", "-D")
        self._wait(self._node_idle, "slurmctld + slurmd (node idle)")
        return self

    def _wait(self, ready, what: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready():
                return
            dead = [p.args[0] for p in self.processes if p.poll() is not None]
            if dead:
                break
            time.sleep(0.5)
        logs = "\n".join(f"--- {p.name}\n{p.read_text()[-2000:]}" for p in sorted(self.folder.glob("*.out"))
                         if p.stat().st_size) + "".join(
            f"\n--- {p.name}\n{p.read_text()[-2000:]}" for p in sorted(self.folder.glob("*.log")) if p.exists())
        self.__exit__(None, None, None)
        raise RuntimeError(f"the test SLURM did not start ({what}); its logs:\n{logs}")

    def __exit__(self, *exc: object) -> None:
        for process in reversed(self.processes):  # slurmd, slurmctld, then munged: only the daemons started here
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        self.processes.clear()
