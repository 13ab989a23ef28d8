"""`faultcast failures`: the failure log `import-prometheus --failures` reads, built from kernel-log Xid lines
and Slurm's node events (faultcast.model.importers.failure_log)."""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from pathlib import Path

from faultcast.cli.paths import create_parents
from faultcast.cli.types import Subcommands, duration


def add_parser(commands: Subcommands) -> None:
    """Register `faultcast failures`."""
    parser = commands.add_parser(
        "failures",
        help="build a failure log from kernel-log Xid lines and Slurm's drain/down events",
        description="Build the failure log that `faultcast import-prometheus --failures` reads from what the "
        "cluster already records: the NVIDIA driver's Xid lines in kernel logs (dmesg -T, journalctl, "
        "kern.log, syslog), mapped to modes through NVIDIA's Xid catalogue with floods folded into one "
        "failure, and Slurm's node events (sacctmgr show event) and drain/down reasons.",
    )
    parser.add_argument("--out", type=Path, required=True, help="the failure log CSV to write")
    kernel = parser.add_argument_group("kernel logs")
    kernel.add_argument(
        "--kernel-log",
        action="append",
        default=[],
        metavar="[NODE=]FILE",
        help="a kernel log (repeatable). Lines with a host field (syslog, journalctl) name their node; "
        "for others (dmesg) give NODE=, else the file name up to its first dot is the node",
    )
    kernel.add_argument(
        "--gpu-map",
        action="append",
        default=[],
        metavar="[NODE=]FILE",
        help="GPU index by PCI bus: `nvidia-smi --query-gpu=index,pci.bus_id,uuid --format=csv` from a node "
        "(repeatable; NODE= or the file name names the node, or a node column). Xids on a bus the map lacks "
        "are written node-level (gpu empty)",
    )
    kernel.add_argument(
        "--boot-time",
        action="append",
        default=[],
        metavar="[NODE=]TIME",
        help="boot time (ISO, e.g. from `uptime -s`) for logs stamped in seconds since boot ([12345.678]); "
        "without NODE= it applies to every such log",
    )
    kernel.add_argument(
        "--year", type=int, help="year of the first line of syslog-style logs, whose stamps carry none "
        "(default: taken from each file's modification time, and said so)"
    )  # fmt: skip
    kernel.add_argument(
        "--short-hostnames",
        action="store_true",
        help="cut host names at the first dot (gpu-07.example -> gpu-07)",
    )
    slurm = parser.add_argument_group("Slurm")
    source = slurm.add_mutually_exclusive_group()
    source.add_argument(
        "--slurm-events",
        action="append",
        default=[],
        type=Path,
        metavar="FILE",
        help="captured `sacctmgr -P show event All_Time format=NodeName,TimeStart,TimeEnd,State,Reason,User` "
        "output (repeatable; a header, -p/-P or the fixed-width table all read)",
    )
    source.add_argument(
        "--from-slurm",
        action="store_true",
        help="ask the cluster (SLURM_CONF): sacctmgr's node history when accounting runs, and sinfo -R",
    )
    slurm.add_argument(
        "--reason",
        action="append",
        default=[],
        metavar="REGEX=MODE",
        help="your own drain-reason rule, tried first (repeatable): 'bad gpu=detachment'; MODE 'skip' marks "
        "planned work",
    )
    general = parser.add_argument_group("all sources")
    general.add_argument(
        "--timezone", default="UTC", help="time zone of stamps written in local time (dmesg -T, syslog, "
        "sacctmgr captures); default UTC"
    )  # fmt: skip
    general.add_argument("--start", help="keep failures from this time on (ISO; local time in --timezone)")
    general.add_argument("--end", help="keep failures up to this time (ISO)")
    general.add_argument(
        "--nodes", action="append", default=[], help="keep only these nodes: a Slurm list, gpu[01-64],login1"
    )
    general.add_argument(
        "--window",
        type=duration,
        default=3600.0,
        help="lines of one node, GPU and mode closer than this to the one before are one failure (default 1h)",
    )
    general.add_argument(
        "--keep-unexplained",
        action="store_true",
        help="write fatal Xids and drain reasons that name no mode as mode 'unknown' (default: count, skip)",
    )
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    from faultcast.model.importers.failure_log import (
        BuildOptions,
        build,
        describe,
        expand_hostlist,
        write_failures,
    )
    from faultcast.model.importers.kernel_log import GpuMap, KernelLogError, KernelLogSource
    from faultcast.model.importers.slurm_events import ReasonRules, SlurmEventError, SlurmQuery, parse_rule

    def fail(message: str) -> int:
        print(f"faultcast failures: {message}", file=sys.stderr)
        return 2

    if not (args.kernel_log or args.slurm_events or args.from_slurm):
        return fail("nothing to read: give --kernel-log, --slurm-events or --from-slurm")
    why = create_parents([("--out", args.out)])
    if why is not None:  # the log is written at the end: refused before anything is read
        return fail(why)
    try:
        zone = ZoneInfo(args.timezone)
    except (ZoneInfoNotFoundError, ValueError):
        return fail(f"--timezone {args.timezone!r} is not a time zone (e.g. UTC, Europe/Berlin)")
    try:
        start_s = _time(args.start, zone, "--start")
        end_s = _time(args.end, zone, "--end")
        boots = _boot_times(args.boot_time, zone)
        rules = ReasonRules(parse_rule(r) for r in args.reason)
        nodes = frozenset(n for text in args.nodes for n in expand_hostlist(text)) if args.nodes else None
    except ValueError as exc:
        return fail(str(exc))
    gpu_map = GpuMap()
    sources = []
    try:
        for text in args.gpu_map:
            node, path = _named(text)
            gpu_map.read(path, node)
        for text in args.kernel_log:
            node, path = _named(text)
            boot = boots.get(node, boots.get(""))
            sources.append(KernelLogSource(path, node, zone, args.year, boot, args.short_hostnames))
    except OSError as exc:
        return fail(f"{exc.filename}: {exc.strerror}")
    except KernelLogError as exc:
        return fail(str(exc))
    utc = dt.UTC
    options = BuildOptions(
        kernel_logs=sources,
        gpu_map=gpu_map,
        slurm_files=args.slurm_events,
        from_slurm=SlurmQuery(env={}) if args.from_slurm else None,  # SLURM_CONF comes from the environment
        zone=zone,
        start_s=start_s,
        end_s=end_s,
        slurm_start=""
        if start_s is None
        else dt.datetime.fromtimestamp(start_s, utc).strftime("%Y-%m-%dT%H:%M:%S"),
        slurm_end=""
        if end_s is None
        else dt.datetime.fromtimestamp(end_s, utc).strftime("%Y-%m-%dT%H:%M:%S"),
        gap_s=args.window,
        nodes=nodes,
        rules=rules,
        keep_unexplained=args.keep_unexplained,
    )
    try:
        failures, report = build(options)
    except (KernelLogError, SlurmEventError) as exc:
        return fail(str(exc))
    except OSError as exc:
        return fail(f"{exc.filename}: {exc.strerror}")
    write_failures(args.out, failures)
    print(describe(args.out, failures, report, options))
    return 0


def _named(text: str) -> tuple[str, Path]:
    """NODE=PATH, or PATH with the node from its file name (up to the first dot). An existing path wins."""
    node, sep, rest = text.partition("=")
    if sep and node and "/" not in node and not Path(text).exists():
        return node, Path(rest)
    path = Path(text)
    return path.name.split(".", 1)[0], path


def _time(text: str | None, zone: dt.tzinfo, flag: str) -> float | None:
    if text is None:
        return None
    try:
        moment = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{flag} {text!r} is not an ISO time (2024-03-04T10:00:00)") from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=zone)).timestamp()


def _boot_times(texts: list[str], zone: dt.tzinfo) -> dict[str, float]:
    """--boot-time values by node ("" for every node)."""
    out: dict[str, float] = {}
    for text in texts:
        node, sep, stamp = text.rpartition("=")
        seconds = _time(stamp, zone, "--boot-time")
        assert seconds is not None
        out[node if sep else ""] = seconds
    return out
