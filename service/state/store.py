"""The service's durable state in `--state-dir`: one SQLite database, one part per concern.

- `alerts` (service/state/alerts.py): every OPEN and CLEARED event; ids never reused, increasing
  across restarts, so a subscriber resumes after the last id it saw with no gap;
- `jobs` (jobs.py) and `acks` (acks.py): registered jobs and their nodes, and the
  acknowledgements of alerts;
- `remediations` (remediations.py): one row per alert, never claimed twice, kept `pending`
  until finished, so a remediation a killed service left unfinished is carried on at the next start;
- `settings` (settings.py): what an admin or the service changed at run time;
- `cursors` (cursors.py): the highest sequence accepted per (node, spool id), so a
  collector's replay after a service restart is not taken twice;
- `scoring` (scoring.py): each node's saved scoring state (service/scoring_state.py), from
  which a restart goes on, with the samples after it replayed from the journal;
- `labels` (labels.py): the fleet's label log, every failure known (the service's FAILED events on
  hardware evidence, harvested logs, operators) and operators' verdicts on alerts;
- `models` (models.py): the model registry's log, every model added, promoted, rolled back and
  shadowed; `shadow_steps`: the shadow's scored steps under both models.

The parts share one connection, one lock and one transaction helper (service/state/db.py): a
damaged database is refused at open (`StateError`), and a failed write (full disk, I/O error)
leaves no transaction open and raises `StateWriteError` naming what was written; callers keep what
they meant to write and retry. `on_writable` hears when writes start failing and when every kind
that failed works again.
"""

from __future__ import annotations

from pathlib import Path

from faultcast.service.state.acks import AckLog
from faultcast.service.state.alerts import AlertLog
from faultcast.service.state.cursors import Cursors
from faultcast.service.state.db import OnWritable, OnWriteFailed, StateDatabase
from faultcast.service.state.jobs import JobRegistry
from faultcast.service.state.labels import LabelLog
from faultcast.service.state.models import ModelEvents, ShadowSteps
from faultcast.service.state.remediations import RemediationLedger
from faultcast.service.state.scoring import SavedStates
from faultcast.service.state.settings import Settings

DATABASE_NAME = "faultcast-service.sqlite"


class StateStore:
    """The open state database and its parts: `alerts`, `jobs`, `acks`, `remediations`,
    `settings`, `cursors`, `scoring`, `labels`, `models`,
    `shadow_steps`. Every method of a part is safe to call from any thread."""

    def __init__(
        self,
        path: Path,
        *,
        on_writable: OnWritable | None = None,
        on_write_failed: OnWriteFailed | None = None,
    ) -> None:
        """Open (or create) the database at `path`; raises StateError when it exists and cannot be
        used. `on_writable(writable, why)`: called when writes start failing and when they work again;
        `on_write_failed(what)`: called on every failed write (what: alerts, cursors, remediation, jobs,
        acks, settings)."""
        self._db = StateDatabase(path, on_writable=on_writable, on_write_failed=on_write_failed)
        self.path = path
        self.alerts = AlertLog(self._db)
        self.jobs = JobRegistry(self._db)
        self.acks = AckLog(self._db)
        self.remediations = RemediationLedger(self._db)
        self.settings = Settings(self._db)
        self.cursors = Cursors(self._db)
        self.scoring = SavedStates(self._db)
        self.labels = LabelLog(self._db)
        self.models = ModelEvents(self._db)
        self.shadow_steps = ShadowSteps(self._db)

    @classmethod
    def in_dir(
        cls,
        state_dir: Path,
        *,
        on_writable: OnWritable | None = None,
        on_write_failed: OnWriteFailed | None = None,
    ) -> StateStore:
        """The store of a `--state-dir` (created if need be)."""
        return cls(state_dir / DATABASE_NAME, on_writable=on_writable, on_write_failed=on_write_failed)

    def watch(self, *, on_writable: OnWritable | None, on_write_failed: OnWriteFailed | None) -> None:
        """Replace the two callbacks given at open (see `__init__`): for an owner that comes after
        the store, as the service does."""
        self._db.on_writable, self._db.on_write_failed = on_writable, on_write_failed

    @property
    def writable(self) -> bool:
        """False while some kind of write fails and has not worked since."""
        return self._db.writable

    def probe(self) -> None:
        """Find out whether writes work again when nobody retries what was refused (StateDatabase.probe)."""
        self._db.probe()

    def close(self) -> None:
        """Close the database; whoever waits for alert events is woken (and told no)."""
        self._db.close()
