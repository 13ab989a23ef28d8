"""The goodput study on measured costs, as text: where the costs came from, how they were carried to a
large job, and whether the goodput target holds at them (and if not, what stands in the way)."""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter

from faultcast.goodput import targets
from faultcast.goodput.cost_scaling import Assumptions, ScaledCost, background_write_s
from faultcast.goodput.engine import JobCosts
from faultcast.goodput.measured_costs import MeasuredCosts
from faultcast.goodput.report import seconds, table
from faultcast.goodput.study import Evaluation, Job, gpu_hours, lost_s

NOT_MODELLED = (
    "communicator re-initialisation growing with the job beyond the flat re-init above (NCCL's ring and "
    "transport set-up loop over all ranks: dozens of seconds at 100k GPUs, NVIDIA/nccl#1789)",
    "the scheduler's latency in placing thousands of nodes (the small job's scheduling is carried as is)",
    "stragglers: the slowest of the job's nodes sets its restart; the fixed parts are one small job's",
    "checkpoint storage shared with other jobs; the background write is printed, not simulated",
    "the pre-scheduled spare being ready within the alert's lead (taken as given)",
    "slower first steps after a restart (compilation, caches, data loader warm-up)",
)


def size(n: float) -> str:
    """Bytes in decimal units."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def measured_lines(m: MeasuredCosts, costs: JobCosts) -> list[str]:
    """Where the costs came from and what the engine takes from them; the ignored keys, once."""
    path = m.path
    lines = [
        f"  costs: measured by `{m.command}` at {m.measured_at} ({m.source}: {m.ranks} ranks, "
        f"{m.parameters:,.0f} parameters, {size(m.state_bytes)} of state; the {path.name} path): "
        f"checkpoint {seconds(costs.checkpoint_s)} (blocking host copy), snapshot {seconds(costs.snapshot_s)}, "
        f"migration {seconds(costs.migrate_s)} after it, crash restart {seconds(costs.restart_s)} once noticed, "
        f"alert to snapshot {seconds(costs.react_s)}",
        f"  not measured (flags): crash detection {seconds(costs.detect_s)}"
        + ("" if costs.evident_detect_s is None else f" ({seconds(costs.evident_detect_s)} with evidence)")
        + f", drained healthy node out {costs.drain_s / 3600:g} h",
        f"  the move, as measured: {seconds(path.blocked_s)} of training blocked, "
        f"{seconds(path.alert_to_first_step_s)} from the alert to the first step on the replacement"
        + (
            f", the spare ready {seconds(path.spare_ready_s)} after the alert"
            if path.spare_ready_s is not None
            else ""
        ),
    ]
    if m.unknown_keys:
        lines.append(f"  ignored (not in the schema): {', '.join(m.unknown_keys)}")
    return lines


def scaling_lines(a: Assumptions, scaled: Sequence[ScaledCost]) -> list[str]:
    """The scaled estimate: the large job, each cost's parts, the assumptions and what is left out."""
    j = a.job
    layout = "fully sharded" if j.shards == j.nodes else f"split into {j.shards:,} shards (replicas beyond)"
    lines = [
        f"scaled estimate: {j.parameters / 1e9:.4g}B parameters x {j.bytes_per_param:g} bytes = "
        f"{size(j.state_bytes)} of training state on {j.gpus:,} GPUs ({j.nodes:,} nodes), {layout}: "
        f"{size(j.bytes_per_node)} per node",
        "",
        "| cost | measured | fixed part | bytes part: per node / bandwidth | written first | re-init | estimate |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for c in scaled:
        moved = f"{size(c.bytes)} / {size(c.bandwidth)}/s = {seconds(c.bytes_s)}" if c.bytes else "none"
        lines.append(
            f"| {c.what} | {seconds(c.measured_s)} | {seconds(c.fixed_s)} | {moved} "
            f"| {seconds(c.write_s) if c.write_s else '-'} | {seconds(c.extra_s) if c.extra_s else '-'} "
            f"| {seconds(c.total_s)} |"
        )
    b = a.bandwidths
    lines += [
        "",
        f"  assumed: host copy {size(b.copy_per_gpu)}/s per GPU ({size(a.copy_per_node)}/s per node), a "
        f"replacement's pull {size(b.network_per_node)}/s per node, checkpoint storage {size(b.storage_total)}/s "
        f"for the cluster ({size(a.storage_per_node)}/s per node when all load at once), re-init "
        f"{seconds(a.reinit_s)} per restart or migration (docs/goodput.md gives the sources)",
        f"  a checkpoint's background write takes {seconds(background_write_s(a))} (it must end before the next)",
        "  not modelled: " + "; ".join(NOT_MODELLED),
    ]
    return lines


def policy_table(job: Job, ev: Evaluation) -> str:
    """(a), (b') and (c') as the study's table."""
    by_key = ev.by_key()
    return table(job, [by_key["a"], by_key["b_tuned"], by_key["c_tuned"]])


def target_lines(job: Job, ev: Evaluation, costs: JobCosts, unmeasured: frozenset[str]) -> list[str]:
    """(b') and (c') against (a), the target's verdict, and (b')'s lost time by what it went to."""
    by_key = ev.by_key()
    a, tuned = by_key["a"], by_key["b_tuned"]
    lines = [""]
    for r in (tuned, by_key["c_tuned"]):
        mine, theirs = r.mean(lost_s), a.mean(lost_s)
        lines.append(
            f"  {r.label.split(' ')[0]} loses {gpu_hours(job, mine):,.0f} GPU-hours against (a)'s "
            f"{gpu_hours(job, theirs):,.0f} ({100 * (1 - mine / theirs):.0f}% less)"
            if theirs > 0
            else f"  {r.label.split(' ')[0]} loses {gpu_hours(job, mine):,.0f} GPU-hours; (a) lost none"
        )
    crashes, baseline = tuned.mean(attrgetter("crashes")), a.mean(attrgetter("crashes"))
    lines.append(
        f"  (b') still crashes {crashes:.1f} times where (a) crashes {baseline:.1f}: its alerts moved the job "
        f"before {baseline - crashes:.1f} failures ({100 * (1 - crashes / baseline) if baseline else 0:.0f}%)"
    )
    check = targets.check(a, tuned)
    verdict = "met" if check.met else "NOT met"
    lines.append(
        f"  target ((b') >= {100 * targets.TARGET_ETTR:.0f}% and at most half of (a)'s lost GPU-hours): {verdict} "
        f"({100 * check.ettr:.2f}%: {'met' if check.ettr_met else 'NOT met'}; lost GPU-hours: "
        f"{'met' if check.lost_met else 'NOT met'})"
    )
    parts = targets.lost_parts(tuned, costs, unmeasured)
    if not check.met:
        top = parts[0]
        lines.append(
            f"  in the way: (b') loses {gpu_hours(job, check.excess_s):,.0f} GPU-hours more than the target "
            f"allows; the largest part is {top.label} ({100 * top.share:.0f}% of its lost time: {top.behind})"
        )
    lines += ["", "| (b') lost time | GPU-hours | share | behind it |", "| --- | --- | --- | --- |"]
    lines += [
        f"| {p.label} | {gpu_hours(job, p.lost_s):,.0f} | {100 * p.share:.1f}% | {p.behind} |" for p in parts
    ]
    return lines
