"""Registered jobs and the nodes each runs on (RegisterJob), in the state database."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence

from faultcast.service.state.db import StateDatabase


class JobRegistry:
    """Which nodes each registered job runs on; registering again replaces the nodes."""

    def __init__(self, db: StateDatabase) -> None:
        self._db = db

    def register(self, job_id: str, nodes: Sequence[str]) -> None:
        """Store the job's nodes (deduplicated); StateWriteError when the database refused it."""
        self._db.checked_write(
            "jobs",
            lambda db: db.execute(
                "INSERT INTO jobs (job_id, nodes, registered_unix) VALUES (?, ?, ?) ON CONFLICT (job_id) "
                "DO UPDATE SET nodes = excluded.nodes, registered_unix = excluded.registered_unix",
                (job_id, json.dumps(sorted(set(nodes))), time.time()),
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
