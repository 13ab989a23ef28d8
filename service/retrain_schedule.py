"""The scheduled retrain (`faultcast serve --retrain-every 7d`): every interval, `faultcast retrain` on the
service's own archive and label log in a child process (a training must not hold the service's
interpreter or memory), then the challenger is added to the model registry and shadowed beside the
serving model. It is never promoted here: promotion waits for the shadow's comparison and an operator
(or `faultcast models promote`, refused unless the challenger catches more at no more false alarms).

The time of the last attempt is kept in the state's settings, so a restart does not retrain at once. A
retrain that fails (too few failures in the window or the holdout yet, a full disk) is logged with its
words and tried again at the next interval; the serving model and any shadow are left as they are.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from faultcast.service.state.settings import Settings

log = logging.getLogger(__name__)

LAST_KEY = "retrain_last_unix"
_CHILD_TIMEOUT_S = 6 * 3600.0  # a retrain of 90 days of a 1,024-GPU fleet is meant to take 20 minutes


@dataclass(frozen=True, slots=True)
class RetrainSchedule:
    """How often, and the retrain's own flags (`faultcast retrain`'s, less --state-dir and --out)."""

    every_s: float
    flags: tuple[str, ...] = ()
    # Continue the model serving when the retrain starts (`--warm-start DIR`), whichever that is then.
    warm_start: bool = False


# (model directory) -> what to do with a challenger: the service adds and shadows it.
OnChallenger = Callable[[Path], None]
# (argv, where its output goes, stopping) -> (exit status, its last words): how the child runs.
RunChild = Callable[[Sequence[str], Path, threading.Event], tuple[int, str]]


def run_child(argv: Sequence[str], output: Path, stopping: threading.Event) -> tuple[int, str]:
    """Run `faultcast retrain` as a child process, its output into `output`; ended (terminated, then
    killed) when the service stops. (status, the tail of what it printed)."""
    output.parent.mkdir(parents=True, exist_ok=True)
    with output.open("w") as sink:
        child = subprocess.Popen(
            [sys.executable, "-m", "faultcast", *argv], stdout=sink, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + _CHILD_TIMEOUT_S
        while child.poll() is None:
            if stopping.wait(1.0) or time.monotonic() > deadline:
                child.terminate()
                try:
                    child.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()
    return child.returncode, output.read_text(errors="replace")[-2000:]


class Retrainer:
    """Runs the schedule on its own thread until `stopping` is set."""

    def __init__(
        self,
        schedule: RetrainSchedule,
        state_dir: Path,
        settings: Settings,
        on_challenger: OnChallenger,
        *,
        run: RunChild = run_child,
        clock: Callable[[], float] = time.time,
        serving_dir: Callable[[], Path] | None = None,
    ) -> None:
        """`serving_dir`: the directory of the model serving now (a warm start continues it)."""
        self.schedule, self.state_dir, self.settings = schedule, state_dir, settings
        self.on_challenger, self.run, self.clock = on_challenger, run, clock
        self.serving_dir = serving_dir
        self.attempts = 0
        self.succeeded = 0

    def due_in_s(self) -> float:
        """Seconds until the next retrain (0: due now); the last attempt is in the settings."""
        raw = self.settings.get(LAST_KEY)
        try:
            last = float(raw) if raw is not None else -float("inf")
        except ValueError:
            last = -float("inf")
        return max(0.0, last + self.schedule.every_s - self.clock())

    def loop(self, stopping: threading.Event) -> None:
        """Wait for each due time and retrain; returns once `stopping` is set."""
        while not stopping.wait(min(self.due_in_s(), 60.0)):
            if self.due_in_s() <= 0:
                self.once(stopping)

    def once(self, stopping: threading.Event) -> Path | None:
        """One retrain now: the challenger's directory, or None when it failed (logged)."""
        started = self.clock()
        self.attempts += 1
        self.settings.save(LAST_KEY, repr(started))
        out = self.state_dir / "retrained" / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(started))
        argv = ["retrain", "--state-dir", str(self.state_dir), "--out", str(out), *self.schedule.flags]
        if self.schedule.warm_start and self.serving_dir is not None:
            argv += ["--warm-start", str(self.serving_dir())]  # promoted since the start: that one
        log.info("scheduled retrain: %s", " ".join(argv))
        status, said = self.run(argv, out.with_name(out.name + ".log"), stopping)
        if stopping.is_set():
            return None
        if status != 0:
            log.error("scheduled retrain failed (exit %d); tried again in %.0f s: %s", status,
                      self.schedule.every_s, said.strip()[-600:])  # fmt: skip
            return None
        self.on_challenger(out)
        self.succeeded += 1
        return out
