"""A help formatter that shows every option's default, so `--help` answers "what if I leave it out"."""

from __future__ import annotations

import argparse


class DefaultsShown(argparse.HelpFormatter):
    """Each option's help ends with its default: the value, "off" for a flag, "none" for an option
    that is simply not set. Help that says its default in its own words ("(default: in-cluster
    config)") and required options are left as they are."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if (
            not action.option_strings
            or action.required
            or action.default is argparse.SUPPRESS
            or "(default" in text
        ):
            return action.help
        if action.default is None:
            return f"{text} (default: none)"
        if action.nargs == 0 and isinstance(action.default, bool):  # store_true and store_false
            return f"{text} (default: {'on' if action.default else 'off'})"
        return f"{text} (default: %(default)s)"
