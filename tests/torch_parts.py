"""Small torch helpers the trainer-side tests share."""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch


@contextmanager
def global_rng_kept() -> Iterator[None]:
    """Give the process-wide generators (Python's, NumPy's, torch's) back as they were: for tests
    that seed, draw from or restore them."""
    saved = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    try:
        yield
    finally:
        random.setstate(saved[0])
        np.random.set_state(saved[1])
        torch.set_rng_state(saved[2])


def filled_linear(value: float) -> torch.nn.Linear:
    """A 3-to-2 linear layer whose every weight and bias is `value`."""
    model = torch.nn.Linear(3, 2)
    with torch.no_grad():
        model.weight.fill_(value)
        model.bias.fill_(value)
    return model
