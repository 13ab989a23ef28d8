"""Random episodes (something that starts at a rate and lasts a while), drawn so that an episode
starting near the end of one chunk goes on into the next."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def episodes(
    r: np.random.Generator, shape: tuple[int, ...], p_start: float, steps: tuple[int, int], extend: int = 0
) -> np.ndarray:
    """Boolean episodes: start with probability p_start per step, last a uniform number of steps.
    With `extend`, the result is that many steps longer, to see episodes running past the end."""
    starts = r.random(shape) < p_start
    lengths = r.integers(steps[0], steps[1] + 1, shape)
    out = np.zeros((shape[0] + extend, *shape[1:]), dtype=bool)
    for index in zip(*np.nonzero(starts), strict=True):
        i = index[0]
        out[(slice(i, i + int(lengths[index])), *index[1:])] = True
    return out


def spilled(
    stream: Callable[[int], np.random.Generator],
    chunk: int,
    shape: tuple[int, ...],
    draw: Callable[..., np.ndarray],
) -> np.ndarray:
    """`draw(generator, shape, extend)` for this chunk, combined with the previous chunk's episodes
    that run past its end: an episode that starts near a chunk's end goes on into the next."""
    current = draw(stream(chunk), shape, 0)
    if chunk == 0:
        return current
    tail = draw(stream(chunk - 1), shape, shape[0])[shape[0] :]
    combined: np.ndarray = current | tail if current.dtype == bool else np.minimum(current, tail)
    return combined


def steps_between(low_s: float, high_s: float, cadence_s: float) -> tuple[int, int]:
    """An episode length range in seconds as whole steps (at least one)."""
    return max(1, round(low_s / cadence_s)), max(1, round(high_s / cadence_s))
