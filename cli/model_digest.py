"""`faultcast model-digest`: a model directory's content digest (model/digest.py), and with --check
whether it is the shipped model's (a reproduction of bench/shipped_model.sh, or the install's own copy)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from faultcast.cli.paths import missing_input, refuse
from faultcast.cli.types import Subcommands


def add_parser(commands: Subcommands) -> None:
    """Add `faultcast model-digest` to `commands`."""
    p = commands.add_parser(
        "model-digest",
        help="print a model's content digest (the same for the same training on the same data)",
        description=__doc__,
    )
    p.add_argument(
        "model",
        type=Path,
        nargs="?",
        help="the model directory (default: the shipped model)",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="compare it with the shipped model's published digest: exit 0 when they are the same, 1 when not",
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Print the digest (with --check: it, the shipped one and the verdict); 0, 1 for a differing
    digest under --check, 2 when either cannot be read."""
    from faultcast.model.digest import DigestError, content_digest
    from faultcast.model.shipped import ShippedModelMissingError, shipped_digest, shipped_model_dir

    why = missing_input([("model", args.model)])
    if why is not None:
        return refuse("model-digest", why)
    try:
        where = args.model if args.model is not None else shipped_model_dir()
        digest = content_digest(where)
        if not args.check:
            print(digest)
            return 0
        published = shipped_digest()
    except (DigestError, ShippedModelMissingError) as exc:
        return refuse("model-digest", str(exc))
    same = digest == published
    print(f"{digest}  {where}")
    print(f"{published}  the shipped model (published)")
    print("same: this is the shipped model" if same else "DIFFERENT: this is not the shipped model")
    if not same:
        print(f"faultcast model-digest: {where} differs from the shipped model", file=sys.stderr)
    return 0 if same else 1
