"""Settings the service changes at run time and keeps across restarts (the remediation pause,
grace deadlines, the breaker's window, silent nodes), as text by key in the state database."""

from __future__ import annotations

from faultcast.service.state.db import StateDatabase


class Settings:
    """Text values by key; None deletes a key."""

    def __init__(self, db: StateDatabase) -> None:
        self._db = db

    def save(self, key: str, value: str | None) -> None:
        """Store `value` under `key` (None: delete it); StateWriteError when the database refused it."""
        if value is None:
            self._db.checked_write(
                "settings", lambda db: db.execute("DELETE FROM settings WHERE key = ?", (key,))
            )
        else:
            self._db.checked_write(
                "settings",
                lambda db: db.execute(
                    "INSERT OR REPLACE INTO settings (key, value) VALUES (?, ?)", (key, value)
                ),
            )

    def get(self, key: str) -> str | None:
        """The value stored under `key`, or None."""
        row = self._db.read_one("SELECT value FROM settings WHERE key = ?", (key,))
        return None if row is None else str(row[0])
