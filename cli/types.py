"""The one type the subcommand modules share: what `add_subparsers()` returns."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, TypeAlias

if TYPE_CHECKING:  # argparse's action is generic only in typeshed, not at run time
    Subcommands: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]
else:
    Subcommands = argparse._SubParsersAction
