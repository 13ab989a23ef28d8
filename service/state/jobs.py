"""Registered jobs, the nodes each runs on and what it asked for (RegisterJob), in the state database:
a restart must not requeue a job that replaces its own nodes, nor forget which jobs can stand by."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass

from faultcast.service.state.db import StateDatabase


class JobRegistry:
    """Which nodes each registered job runs on; registering again replaces the nodes."""

    def __init__(self, db: StateDatabase) -> None:
        self._db = db

    def register(
        self, job_id: str, nodes: Sequence[str], *, replaces_nodes: bool = False, stands_by: bool = False
    ) -> None:
        """Store the job's nodes (deduplicated) and its flags; StateWriteError when the database
        refused it."""
        self._db.checked_write(
            "jobs",
            lambda db: db.execute(
                "INSERT INTO jobs (job_id, nodes, registered_unix, replaces_nodes, stands_by) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT (job_id) DO UPDATE SET nodes = excluded.nodes, "
                "registered_unix = excluded.registered_unix, replaces_nodes = excluded.replaces_nodes, "
                "stands_by = excluded.stands_by",
                (job_id, json.dumps(sorted(set(nodes))), time.time(), int(replaces_nodes), int(stands_by)),
            ),
        )

    def forget(self, job_id: str) -> None:
        """Drop the job's registration (it ended: a standby carries it on under its own id);
        StateWriteError when the database refused it."""
        self._db.checked_write("jobs", lambda db: db.execute("DELETE FROM jobs WHERE job_id = ?", (job_id,)))

    def all(self) -> dict[str, list[str]]:
        """Every registered job and its nodes, sorted."""
        rows = self._db.read("SELECT job_id, nodes FROM jobs")
        return {job: list(json.loads(nodes)) for job, nodes in rows}

    def flags(self) -> dict[str, JobFlags]:
        """What each registered job asked for at its last registration."""
        rows = self._db.read("SELECT job_id, replaces_nodes, stands_by FROM jobs")
        return {str(job): JobFlags(bool(replaces), bool(stands)) for job, replaces, stands in rows}

    def on_node(self, node: str) -> list[str]:
        """The registered jobs that run on `node`, sorted."""
        return sorted(job for job, nodes in self.all().items() if node in nodes)


@dataclass(frozen=True, slots=True)
class JobFlags:
    """RegisterJobRequest's flags, as the job last gave them."""

    replaces_nodes: bool  # the job replaces a lost or warned node itself: a drain requeues nothing
    stands_by: bool  # its trainer can stand by on a spare
