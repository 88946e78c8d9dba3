#!/usr/bin/env bash
# The system packages `make test-cluster` launches ranks with: Open MPI's mpirun (Habana's examples and Quick Start
# launch with it), a single-node SLURM (slurmctld + slurmd, with munge for its authentication) for srun.
# The Python side (mpi4py, ray[train]) is the `cluster` extra, installed by the Makefile in its own layered environment.
# Needs root and apt-get (Debian / Ubuntu); elsewhere it says what to install and fails, since the tests need them.
set -euo pipefail
PACKAGES=(openmpi-bin libopenmpi-dev slurm-wlm munge)
missing=()
for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "install_cluster: missing ${missing[*]}: sudo apt-get install -y ${missing[*]}" >&2
    exit 1
fi
echo "install_cluster: installing ${missing[*]} with apt-get..."
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
# The packages' own services are not started by dpkg here (policy-rc.d); the tests start their own slurmctld, slurmd
# and munged on 127.0.0.1 with a configuration of their own.
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
