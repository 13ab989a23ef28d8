"""Independent random streams, keyed so that each node's data depends only on (seed, node, ...).

A node's telemetry never depends on how many other nodes the fleet has, nor on the order in which
the offline writer or a live collector asks for it: that is what makes offline and live equal.
"""

from __future__ import annotations

import enum

import numpy as np


class Stream(enum.IntEnum):
    """What a random stream is for; part of its key, so streams of different purposes never overlap.
    The values are part of every twin's output: changing one changes the data a seed gives."""

    TRAITS = 1
    SCHEDULE = 2
    JOBS = 3
    PHASES = 4
    CHUNK = 5
    UUID = 6
    RACK = 7  # events a whole rack shares (room cooling, a PDU's power brake)
    WEATHER = 8  # the day-to-day inlet drift every node shares
    HISTORY = 9  # a node's own failure history: its frailty, refaults after repair (World.frailty_shape)


def rng(seed: int, stream: Stream, *keys: int) -> np.random.Generator:
    """A fresh generator for (seed, stream, *keys); the same arguments always give the same draws."""
    return np.random.default_rng(np.random.SeedSequence([seed, int(stream), *keys]))
