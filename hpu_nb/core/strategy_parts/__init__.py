"""The pieces every HPU strategy is built from, for the Trainer (hpu_nb.core.strategies) and for Fabric
(hpu_nb.core.fabric) alike: HCCL's reduce semantics (collectives), the launcher choice, the Gaudi fork check and the
launchers' liveness (launchers, liveness, rank_processes, interrupts, worker_output), the multi-card mixin
(parallel), the HPU guards (guards) and FSDP's rules and precision (fsdp).

It imports neither flavour's strategies (an import-linter contract keeps it so): each flavour's classes are thin
adapters that put these pieces on its own Lightning bases and add its own hooks.
"""
