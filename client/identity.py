"""Who the training process is to the service: its job id and node name, from the scheduler's
environment unless given, and the names of all the job's nodes (a collective)."""

from __future__ import annotations

import os
import socket

import torch.distributed as dist

# Slurm's, then one an operator sets, then torchrun's (the same on every rank of one launch).
JOB_ID_VARIABLES = ("SLURM_JOB_ID", "FAULTCAST_JOB_ID", "TORCHELASTIC_RUN_ID")
"""The environment variables job_id reads, in order; the first one set and non-empty wins."""


def job_id(explicit: str | None = None) -> str:
    """`explicit`, else the first of JOB_ID_VARIABLES set, else "<host>-<pid>" (one process's own id)."""
    if explicit:
        return explicit
    for name in JOB_ID_VARIABLES:
        if os.environ.get(name):
            return os.environ[name]
    return f"{socket.gethostname()}-{os.getpid()}"


def node_name(explicit: str | None = None) -> str:
    """The scheduler's name for this node (`slurmd -N` may differ from the host name)."""
    return explicit or os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def all_gather_strings(value: str) -> list[str]:
    """Every rank's `value`; just this one's outside torch.distributed. Collective."""
    if not (dist.is_available() and dist.is_initialized()):
        return [value]
    out: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return [str(v) for v in out]
