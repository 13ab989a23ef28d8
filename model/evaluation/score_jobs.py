"""Scoring spread over processes: many (data, model, inputs) scorings at once, each split by nodes.

The features never look across nodes (model/features/relative.py), so a node's scores do not depend on
which other nodes were replayed beside it: a scoring of N nodes is the scorings of any partition of
them, side by side. An evaluation's scorings (every dataset on all inputs and on dcgm-exporter's
defaults, and again by an in-world reference) are independent too. `score_all` runs them in local
processes or on a Dask cluster (model/evaluation/world_pass.py) and joins each one's parts back in node order:
the result is `score_period`'s, whatever the number of processes.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from faultcast.model.artifact import FaultModel
from faultcast.model.evaluation.evaluate import DCGM_DEFAULT_MISSING, Scored, held_out_part, score_period
from faultcast.model.evaluation.outcomes import ScoredPeriod
from faultcast.model.evaluation.world_pass import map_worlds
from faultcast.model.features.offline import Dataset


@dataclass(frozen=True)
class ScoreJob:
    """One scoring: `model` over `nodes` of `dataset` in [start_s, end_s), `masked` inputs blanked."""

    dataset: Dataset
    model: FaultModel
    nodes: tuple[int, ...]
    start_s: float
    end_s: float
    masked: tuple[str, ...] = ()

    def part(self, nodes: tuple[int, ...]) -> ScoreJob:
        return ScoreJob(self.dataset, self.model, nodes, self.start_s, self.end_s, self.masked)

    def gpu_steps(self) -> float:
        """The job's size: slots times seconds (what its replay costs, roughly)."""
        return len(self.nodes) * self.dataset.gpus_per_node * (self.end_s - self.start_s)


def run_job(job: ScoreJob) -> ScoredPeriod:
    """One job scored (a top-level function: it runs in other processes too)."""
    return score_period(job.dataset, job.model, job.nodes, job.start_s, job.end_s, masked_inputs=job.masked)


def split(jobs: Sequence[ScoreJob], workers: int) -> list[list[ScoreJob]]:
    """Each job as parts of contiguous nodes: one part each when there are at least as many jobs as
    workers, else enough parts that every worker has one (a job is never cut below one node)."""
    if workers <= len(jobs):
        return [[job] for job in jobs]
    pieces = math.ceil(workers / len(jobs))
    out = []
    for job in jobs:
        count = min(pieces, len(job.nodes))
        bounds = np.linspace(0, len(job.nodes), count + 1).round().astype(int)
        out.append([job.part(job.nodes[lo:hi]) for lo, hi in itertools.pairwise(bounds)])
    return out


def join(parts: Sequence[ScoredPeriod]) -> ScoredPeriod:
    """Scorings of disjoint node sets over the same steps, as one (slots in the parts' order)."""
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    for part in parts[1:]:
        if not np.array_equal(part.times_s, first.times_s):
            raise ValueError("the parts of a scoring cover different steps")
    return ScoredPeriod(
        times_s=first.times_s,
        nodes=tuple(n for p in parts for n in p.nodes),
        gpus_per_node=first.gpus_per_node,
        present=np.concatenate([p.present for p in parts], axis=1),
        scores={m: np.concatenate([p.scores[m] for p in parts], axis=1) for m in first.scores},
        labels=np.concatenate([p.labels for p in parts], axis=1),
        modes=np.concatenate([p.modes for p in parts], axis=1),
        censored=first.censored,  # the dataset's spans, the same in every part
    )


def score_all(jobs: Sequence[ScoreJob], *, processes: int = 1, client: Any = None) -> list[ScoredPeriod]:
    """Every job's scored period, in order: in this process, in `processes` local ones, or on the Dask
    `client`'s workers (then split for as many parts as it has worker threads)."""
    if not jobs:
        return []
    workers = processes
    if client is not None:
        workers = max(1, sum(client.nthreads().values()))
    parts = split(jobs, workers)
    # The largest parts first: a pool that takes them in order ends with small ones, not one straggler.
    flat = [(i, k, part) for i, job_parts in enumerate(parts) for k, part in enumerate(job_parts)]
    flat.sort(key=lambda item: -item[2].gpu_steps())
    scored = map_worlds(run_job, [(part,) for _, _, part in flat], jobs=processes, client=client)
    by_job: list[dict[int, ScoredPeriod]] = [{} for _ in jobs]
    for (i, k, _), period in zip(flat, scored, strict=True):
        by_job[i][k] = period
    return [join([found[k] for k in sorted(found)]) for found in by_job]


def score_datasets(
    datasets: Sequence[Dataset],
    model: FaultModel,
    references: Sequence[tuple[FaultModel, Sequence[Dataset]]] = (),
    *,
    processes: int = 1,
    client: Any = None,
) -> tuple[list[Scored], list[dict[Path, ScoredPeriod]]]:
    """Each dataset scored as `evaluate.score_dataset` scores it (the part the model never trained on,
    on every input and on dcgm-exporter's defaults), and each (reference, its datasets) scored on the
    same parts (`ceiling.score_like`), all in one `score_all`: the references' scorings by each data's
    resolved path."""
    parts = [held_out_part(dataset, model) for dataset in datasets]
    jobs = []
    for dataset, (nodes, start, _) in zip(datasets, parts, strict=True):
        for masked in ((), DCGM_DEFAULT_MISSING):
            jobs.append(ScoreJob(dataset, model, tuple(nodes), start, dataset.end_s, masked))
    for reference, theirs in references:
        for dataset in theirs:
            nodes, start, _ = held_out_part(dataset, model)
            jobs.append(ScoreJob(dataset, reference, tuple(nodes), start, dataset.end_s))
    done = iter(score_all(jobs, processes=processes, client=client))
    scored = [
        Scored(dataset, next(done), next(done), start, same)
        for dataset, (_, start, same) in zip(datasets, parts, strict=True)
    ]
    by_reference = [{dataset.path.resolve(): next(done) for dataset in theirs} for _, theirs in references]
    return scored, by_reference
