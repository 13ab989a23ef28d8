"""One node replaced, not the whole job: how to launch a job under torchrun's elastic rendezvous so
that when a node dies, the surviving nodes and a warm spare form the job again within seconds, and
the replacement's part comes from its buddy's memory (faultcast.client.replicas).

Each node runs one torchrun agent; a warm spare is one more agent with the same rendezvous id,
started ahead (its Python and torch imported, its node allocated). With `--nnodes N:N` the spare
waits on the rendezvous' redundancy list and never disturbs the running group; when a node dies, the
survivors' workers fail (their collectives break, or the service's FAILED event ends them at once
through `Protection(on_failure=...)`), their agents restart them, and the next round takes the spare
in. Every rank then calls `Protection.resume()` (or `BuddyReplicas.restore()`): the newest step whose
every rank's part survives on some node is loaded, each rank reading its part locally when its node
holds it and receiving it from the holder otherwise. Ranks may be renumbered by the new round; each
rank loads the part of its rank number, so training goes on exactly as before if the data a rank
reads follows its rank number (a distributed sampler does).

What makes the second round form (torch 2.13, found by killing nodes; see docs/benchmarks.md):

- `TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`. By default the agents share one store for the workers,
  hosted by the first round's rank 0 agent, and a later round does not publish its address again:
  a new agent (the spare) waits for it until `read_timeout`, and when the dead node was rank 0 the
  survivors keep calling a store that is gone (pytorch/pytorch#135712). With the variable set, every
  round's rank 0 worker hosts a fresh store.
- A short heartbeat (`keep_alive_interval=1`, 3 attempts): the dead node leaves the rendezvous after
  about 3 s instead of 15.
- The rendezvous store outside the nodes that may die (`is_host=0`, an endpoint on a service host):
  a store hosted by an agent dies with its node.
- `--nnodes N:N`, not `M:N`: with a minimum below N the spare joins the wait list instead, which
  restarts the healthy group to take it in, and a round could form without it (a smaller world,
  whose replicas do not fit).

A spare never used ends with exit status 1 when the job finishes (torch 2.13's launcher, after
"Rendezvous gracefully exited"): the scheduler's record of the spare's job says failed, not the job.
"""

from __future__ import annotations

from collections.abc import Mapping

ELASTIC_ENV: Mapping[str, str] = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
"""Environment every agent needs (see the module)."""


def rdzv_conf(
    *,
    keep_alive_s: int = 1,
    keep_alive_attempts: int = 3,
    read_timeout_s: int = 30,
    join_timeout_s: int = 600,
) -> str:
    """torchrun's `--rdzv-conf` for an external c10d store: a dead node leaves after
    `keep_alive_s` x `keep_alive_attempts` seconds; a store read waits `read_timeout_s`; a node waits
    `join_timeout_s` for the others at the first start."""
    for name, value in (
        ("keep_alive_s", keep_alive_s),
        ("keep_alive_attempts", keep_alive_attempts),
        ("read_timeout_s", read_timeout_s),
        ("join_timeout_s", join_timeout_s),
    ):
        if value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")
    return (
        f"is_host=0,keep_alive_interval={keep_alive_s},keep_alive_max_attempt={keep_alive_attempts},"
        f"read_timeout={read_timeout_s},join_timeout={join_timeout_s}"
    )


def torchrun_args(
    *,
    nodes: int,
    procs_per_node: int,
    endpoint: str,
    run_id: str,
    local_addr: str,
    max_restarts: int = 3,
    monitor_s: float = 0.2,
) -> list[str]:
    """The options of `python -m torch.distributed.run` for one node of an elastic job of `nodes`
    nodes (the spare's agent takes the same): the rendezvous at `endpoint` (host:port of a c10d
    store outside the job's nodes) under `run_id`; `local_addr`: this node's address that the others
    reach; `max_restarts`: the worker restarts a node's agent allows (one per lost node)."""
    if nodes < 1 or procs_per_node < 1:
        raise ValueError(f"nodes and procs_per_node must be at least 1, got {nodes} and {procs_per_node}")
    return [
        "--nnodes", f"{nodes}:{nodes}", "--nproc-per-node", str(procs_per_node),
        "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", run_id,
        "--rdzv-conf", rdzv_conf(), "--local-addr", local_addr,
        "--max-restarts", str(max_restarts), "--monitor-interval", str(monitor_s),
    ]  # fmt: skip
