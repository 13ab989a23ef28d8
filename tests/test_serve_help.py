"""`faultcast serve --help` shows every option's default, taken here from the parser and
from the service's configuration itself, so a changed default cannot leave the help behind."""

from __future__ import annotations

import argparse

import pytest

from faultcast.cli.app import build_parser, main
from faultcast.service.config import ServiceConfig
from faultcast.service.remediation.actuators import RetryPolicy
from faultcast.service.rpc.validation import Limits


def _serve_parser() -> argparse.ArgumentParser:
    (commands,) = (a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    parser: argparse.ArgumentParser = commands.choices["serve"]
    return parser


def _help_text(capsys: pytest.CaptureFixture[str]) -> str:
    """What `faultcast serve --help` prints, its options part, whitespace made single spaces."""
    with pytest.raises(SystemExit) as done:
        main(["serve", "--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    return text.split(" options: ", 1)[1]  # past the usage line, which names every flag too


def _entry(action: argparse.Action) -> str:
    """How the option's own entry starts, e.g. "--spares {none,slurm,...}" (the flag alone is also
    named in other options' help)."""
    flag = action.option_strings[-1]
    if action.nargs == 0:
        return f"{flag} "
    if action.metavar is not None:
        return f"{flag} {action.metavar} "
    if action.choices is not None:
        return f"{flag} {{{','.join(map(str, action.choices))}}} "
    return f"{flag} {action.dest.upper()} "


def _default_shown(text: str, flag: str) -> str:
    """The default the help shows for `flag`: its entry's "(default: ...)"."""
    (action,) = (a for a in _serve_parser()._actions if flag in a.option_strings)
    after = text.split(f" {_entry(action)}", 1)[1]
    return after.split("(default: ", 1)[1].split(")", 1)[0]


def test_every_option_with_a_default_shows_it(capsys: pytest.CaptureFixture[str]) -> None:
    text = _help_text(capsys)
    options = [
        a
        for a in _serve_parser()._actions
        if a.option_strings and not a.required and a.default is not argparse.SUPPRESS
    ]
    assert options
    for action in options:
        flag = action.option_strings[-1]
        if action.help is not None and "(default" in action.help:  # said in the help's own words
            continue
        if action.default is None:
            expected = "none"
        elif action.nargs == 0:
            expected = "on" if action.default else "off"
        else:
            expected = str(action.default)
        assert _default_shown(text, flag) == expected, flag


def test_the_help_shows_the_service_configurations_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    text = _help_text(capsys)
    config, limits, retry = ServiceConfig(), Limits(), RetryPolicy()
    defaults = {
        "--grace": config.grace_s,
        "--max-drains": config.max_drains,
        "--drain-window": config.drain_window_s,
        "--silent-after": config.silent_after_steps,
        "--failure-grace": config.silence_grace_s,
        "--keepalive": config.keepalive_s,
        "--failure-hold": config.failure_hold_s,
        "--max-clock-skew": limits.max_future_s,
        "--max-sample-age": limits.max_age_s,
        "--remediation-attempts": retry.max_attempts,
        "--remediation-backoff": retry.initial_s,
        "--remediation-backoff-max": retry.max_s,
    }
    assert {flag: _default_shown(text, flag) for flag in defaults} == {
        flag: str(value) for flag, value in defaults.items()
    }
