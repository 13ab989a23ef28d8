"""`faultcast failures`: driver-format Xid lines, NVIDIA's catalogue, floods, GPU maps, Slurm's events (text
captured from sacctmgr, and a real local Slurm cluster's drain and down reasons), and a log the importer takes."""

from __future__ import annotations

import csv
import datetime as dt
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from faultcast import cli
from faultcast.catalogue import TRACKED_XIDS
from faultcast.model.features.offline import open_dataset
from faultcast.model.importers.failure_log import (
    BuildOptions,
    FailureBook,
    build,
    expand_hostlist,
    write_failures,
)
from faultcast.model.importers.kernel_log import (
    GpuMap,
    KernelLogError,
    KernelLogSource,
    KernelLogStats,
    read_kernel_log,
)
from faultcast.model.importers.slurm_events import (
    ReasonRules,
    SlurmEventError,
    Verdict,
    parse_rule,
    parse_sacctmgr_events,
)
from faultcast.modes import FailureMode
from faultcast.schemas import FAILURE_FIELDS
from faultcast.testing.slurm_cluster import SlurmCluster, running_cluster
from faultcast.xid_catalogue import CATALOGUE, XidKind, lookup

UTC = ZoneInfo("UTC")
T0 = dt.datetime(2024, 3, 4, 10, 11, 12, tzinfo=dt.UTC).timestamp()
XID_79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."
XID_48 = (
    "NVRM: Xid (PCI:0000:ca:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) "
    "has been detected on GPU in the framebuffer at partition 0, subpartition 0."
)


def _source(
    path: Path, *, zone: ZoneInfo = UTC, year: int | None = None, boot_s: float | None = None
) -> KernelLogSource:
    """The file, its node named by its file name up to the first dot."""
    return KernelLogSource(path, path.name.split(".")[0], zone, year, boot_s)


def _lines(
    path: Path, text: str, *, zone: ZoneInfo = UTC, year: int | None = None
) -> list[tuple[float, str, str, int]]:
    path.write_text(text)
    source = _source(path, zone=zone, year=year)
    return [(x.time_s, x.node, x.bus, x.xid) for x in read_kernel_log(source, KernelLogStats(), {})]


def _read(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


# -- driver formats ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "node"),
    [
        (f"[Mon Mar  4 10:11:12 2024] {XID_79}", "gpu-07"),  # dmesg -T
        (f"Mar  4 10:11:12 gpu-08 kernel: {XID_79}", "gpu-08"),  # syslog, kern.log, journalctl short
        (f"Mar 04 10:11:12.123456 gpu-08 kernel: [12345.678901] {XID_79}", "gpu-08"),  # short-precise
        (f"2024-03-04T10:11:12+0000 gpu-08 kernel: {XID_79}", "gpu-08"),  # journalctl -o short-iso
        (f"2024-03-04T11:11:12.000000+01:00 gpu-08 kernel: {XID_79}", "gpu-08"),  # rsyslog RFC 3339
        (f"2024-03-04T10:11:12Z gpu-08 kernel: {XID_79}", "gpu-08"),
        (f"Mon 2024-03-04 10:11:12 UTC gpu-08 kernel: {XID_79}", "gpu-08"),  # journalctl -o short-full
        (f"1709547072.000000 gpu-08 kernel: {XID_79}", "gpu-08"),  # journalctl -o short-unix
    ],
)
def test_the_driver_line_is_read_in_every_stamp(tmp_path: Path, line: str, node: str) -> None:
    got = _lines(tmp_path / "gpu-07.log", line + "\n", year=2024)
    assert got == [(T0, node, "0000:3b:00", 79)]


@pytest.mark.parametrize(
    "bus_part",
    ["PCI:0000:3b:00", "0000:3b:00", "PCI:0000:3B:00.0", "PCI:0000:3b:00 GPU-I:05"],  # old, upper case, MIG
)
def test_bus_variants(tmp_path: Path, bus_part: str) -> None:
    line = f"[Mon Mar  4 10:11:12 2024] NVRM: Xid ({bus_part}): 94, pid=7194, Contained: CE User Channel (0x9).\n"
    assert _lines(tmp_path / "n.log", line) == [(T0, "n", "0000:3b:00", 94)]


def test_local_stamps_take_the_time_zone(tmp_path: Path) -> None:
    berlin = ZoneInfo("Europe/Berlin")  # UTC+1 in March
    got = _lines(tmp_path / "n.log", f"[Mon Mar  4 11:11:12 2024] {XID_79}\n", zone=berlin)
    assert got[0][0] == T0


def test_uptime_stamps_need_a_boot_time(tmp_path: Path) -> None:
    log = tmp_path / "gpu-07.dmesg"
    log.write_text("[    5.000000] nvidia: loading out-of-tree module\n[  100.500000] " + XID_79 + "\n")
    with pytest.raises(KernelLogError, match=r"gpu-07\.dmesg:2: .*seconds since boot.*--boot-time gpu-07="):
        list(read_kernel_log(_source(log), KernelLogStats(), {}))
    got = list(read_kernel_log(_source(log, boot_s=T0 - 100.5), KernelLogStats(), {}))
    assert [x.time_s for x in got] == [T0]


def test_syslog_years_from_the_flag_or_the_files_last_write(tmp_path: Path) -> None:
    text = f"Dec 31 23:59:00 n kernel: {XID_79}\nJan  1 00:01:00 n kernel: {XID_79}\n"
    years = [
        dt.datetime.fromtimestamp(t, dt.UTC).year for t, *_ in _lines(tmp_path / "a.log", text, year=2023)
    ]
    assert years == [2023, 2024]  # --year is the first line's; December to January starts the next
    log = tmp_path / "b.log"
    log.write_text(text)
    written = dt.datetime(2024, 1, 2, tzinfo=dt.UTC).timestamp()
    os.utime(log, (written, written))
    stats = KernelLogStats()
    got = [dt.datetime.fromtimestamp(x.time_s, dt.UTC).year for x in read_kernel_log(_source(log), stats, {})]
    assert got == [2023, 2024]
    assert "took 2023, 2024 from the file's modification time" in stats.assumptions[0]


def test_other_lines_are_counted_and_broken_xid_lines_are_not_fatal(tmp_path: Path) -> None:
    log = tmp_path / "n.log"
    log.write_text(
        "[Mon Mar  4 10:11:11 2024] usb 1-1: new device\n"
        "NVRM: Xid (PCI:0000:3b:00): 79, no stamp at all\n"
        "[Mon Mar  4 10:11:12 2024] NVRM: Xid (garbled\n"
        f"[Mon Mar  4 10:11:12 2024] {XID_79}\n"
    )
    stats = KernelLogStats()
    assert [x.xid for x in read_kernel_log(_source(log), stats, {})] == [79]
    assert (stats.lines, stats.xid_lines, stats.unparseable) == (4, 3, 2)
    assert stats.first_unparseable.startswith(f"{log}:2 ")


# -- the catalogue -------------------------------------------------------------------------------------


def test_the_catalogue_reads_every_xid_the_collector_tracks() -> None:
    assert set(TRACKED_XIDS) <= set(CATALOGUE)
    expected = {48: "hbm_wear", 64: "hbm_wear", 94: "hbm_wear", 95: "hbm_wear", 74: "nvlink",
                79: "detachment", 119: "firmware", 120: "firmware"}  # fmt: skip
    for code, mode in expected.items():
        entry = lookup(code)
        assert entry is not None, code
        assert (entry.kind, entry.mode) == (XidKind.FAILURE, mode), code
    assert {c for c, x in CATALOGUE.items() if x.kind is XidKind.APPLICATION} >= {13, 31, 43}
    assert {c for c, x in CATALOGUE.items() if x.kind is XidKind.INFORMATIONAL} >= {63, 92, 154}
    assert all((x.mode is not None) == (x.kind is XidKind.FAILURE) for x in CATALOGUE.values())
    assert lookup(99999) is None


# -- floods ----------------------------------------------------------------------------------------------


def _flood(path: Path, lines: int) -> None:
    """`lines` Xid 119 lines on GPU 0 every 6 s with kernel chatter between, a second flood on GPU 1, and
    after two quiet hours the same fault again on GPU 0."""
    with path.open("w") as handle:
        for i in range(lines):
            moment = dt.datetime.fromtimestamp(T0 + 6 * (i // 2), dt.UTC)
            stamp = moment.strftime("%Y-%m-%dT%H:%M:%S+00:00")
            bus = "0000:3b:00" if i % 2 == 0 else "0000:5d:00"
            handle.write(f"{stamp} gpu-07 kernel: NVRM: Xid (PCI:{bus}): 119, pid={i}, name=python, Timeout "
                         "after 6s of waiting for RPC response from GPU0 GSP! Expected function 76\n")  # fmt: skip
            if i % 10 == 0:
                handle.write(f"{stamp} gpu-07 kernel: nvidia-nvswitch: chatter {i}\n")
        later = dt.datetime.fromtimestamp(T0 + 3 * (lines + 2400), dt.UTC).strftime("%Y-%m-%dT%H:%M:%S+00:00")
        handle.write(f"{later} gpu-07 kernel: NVRM: Xid (PCI:0000:3b:00): 119, pid=1, name=python, again\n")


_PEAK_RSS = """
import resource, sys
from pathlib import Path
from zoneinfo import ZoneInfo
from faultcast.model.importers.failure_log import BuildOptions, build
from faultcast.model.importers.kernel_log import KernelLogSource
failures, report = build(BuildOptions(kernel_logs=[KernelLogSource(Path(sys.argv[1]), "n", ZoneInfo("UTC"))]))
print(report.kernel.lines, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def _peak_rss_kib(log: Path) -> tuple[int, int]:
    """(lines read, peak resident KiB) of a fresh interpreter building the failure log of `log`."""
    done = subprocess.run(
        [sys.executable, "-c", _PEAK_RSS, str(log)], capture_output=True, text=True, check=True
    )
    lines, peak = done.stdout.split()
    return int(lines), int(peak)


def test_a_flood_of_200k_lines_is_three_failures(tmp_path: Path) -> None:
    log, gpus = tmp_path / "kern.log", tmp_path / "gpu-07.csv"
    _flood(log, 200_000)
    gpus.write_text("index, pci.bus_id, uuid\n0, 00000000:3B:00.0, GPU-a\n1, 00000000:5D:00.0, GPU-b\n")
    gpu_map = GpuMap()
    gpu_map.read(gpus, "gpu-07")
    failures, report = build(BuildOptions(kernel_logs=[_source(log)], gpu_map=gpu_map))
    assert [(f.node, f.gpu, f.uuid, f.mode, f.xid) for f in failures] == [
        ("gpu-07", 0, "GPU-a", "firmware", 119), ("gpu-07", 1, "GPU-b", "firmware", 119),
        ("gpu-07", 0, "GPU-a", "firmware", 119)]  # fmt: skip
    assert failures[0].time_s == failures[1].time_s == T0  # the first line's time
    assert "[100000 lines until" in failures[0].description
    assert (report.kernel.xid_lines, report.failure_lines, report.kernel_failures) == (200_001, 200_001, 3)
    assert report.kernel.lines == 200_001 + 20_000


def test_the_flood_is_read_in_flat_memory(tmp_path: Path) -> None:
    small, big = tmp_path / "small.log", tmp_path / "big.log"
    _flood(small, 2_000)
    _flood(big, 200_000)
    assert big.stat().st_size > 30_000_000
    small_lines, small_kib = _peak_rss_kib(small)
    big_lines, big_kib = _peak_rss_kib(big)
    assert (small_lines, big_lines) == (2_201, 220_001)
    # Holding the lines would take more than the file's 30 MB; streaming keeps the peak where it was.
    assert big_kib - small_kib < 8_000, (small_kib, big_kib)


def test_the_book_merges_out_of_order_lines_into_the_same_spans() -> None:
    times = [0.0, 100.0, 5000.0, 50.0, 9000.0, 2600.0, 20000.0, 12600.0]
    forward, shuffled = FailureBook(3600.0), FailureBook(3600.0)
    for t in sorted(times):
        forward.add(("n", 0, "nvlink"), t, xid=74, uuid="", text=f"at {t}")
    for t in times:
        shuffled.add(("n", 0, "nvlink"), t, xid=74, uuid="", text=f"at {t}")
    # 0..5000 chain (each within an hour of the one before); 9000 and 12600 chain; 20000 stands apart
    assert [f.time_s for f in forward.failures()] == [0.0, 9000.0, 20000.0]
    assert shuffled.failures() == forward.failures()
    assert shuffled.failures()[0].description.startswith("at 0.0 [5 lines")


# -- GPU maps and node-level fallback -----------------------------------------------------------------


def test_the_gpu_map_names_the_gpu_and_an_unknown_bus_is_node_level(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "kern.log"
    log.write_text(
        f"Mar  4 10:11:12 gpu-07 kernel: NVRM: GPU at PCI:0000:ca:00: GPU-509665ad-b600-ac93-3616-d754b23d636d\n"
        f"Mar  4 10:11:12 gpu-07 kernel: {XID_48}\n"
        f"Mar  4 10:11:12 gpu-08 kernel: {XID_79}\n"
        f"Mar  4 10:11:13 gpu-08 kernel: NVRM: Xid (PCI:0000:3b:00): 13, pid=1, name=python, Graphics Exception\n"
        f"Mar  4 10:11:14 gpu-08 kernel: NVRM: Xid (PCI:0000:3b:00): 63, pid=1, Row Remapper: New row marked\n"
        f"Mar  4 10:11:15 gpu-08 kernel: NVRM: Xid (PCI:0000:3b:00): 161, pid=1, name=x, something new\n"
        f"Mar  4 10:11:16 gpu-08 kernel: NVRM: Xid (PCI:0000:3b:00): 46, pid=1, name=x, GPU stopped processing\n"
    )
    gpus = tmp_path / "gpus.csv"
    gpus.write_text("node,index,pci.bus_id\ngpu-07,6,00000000:CA:00.0\ngpu-07,7,00000000:DB:00.0\n")
    out = tmp_path / "failures.csv"
    argv = ["failures", "--out", str(out), "--kernel-log", str(log), "--gpu-map", str(gpus), "--year", "2024"]
    assert cli.main(argv) == 0
    summary = capsys.readouterr().out
    rows = _read(out)
    assert [(r["node"], r["gpu"], r["mode"], r["xid"]) for r in rows] == [
        ("gpu-07", "6", "hbm_wear", "48"), ("gpu-08", "", "detachment", "79")]  # fmt: skip
    assert rows[0]["uuid"] == "GPU-509665ad-b600-ac93-3616-d754b23d636d"  # from the driver's "GPU at" line
    assert rows[0]["timestamp"] == "2024-03-04T10:11:12Z"
    assert rows[0]["precursor_s"] == ""
    assert rows[0]["description"].startswith(f"kernel log {log}:2: NVRM: Xid")
    assert (
        "node-level because the GPU was unknown: 1 failures (no --gpu-map entry for gpu-08 0000:3b:00)"
        in summary
    )
    assert "application Xids (not hardware): 1 lines (Xid 13: 1)" in summary
    assert "informational Xids (warnings, precursors): 1 lines (Xid 63: 1)" in summary
    assert "unknown Xids (not in faultcast's catalogue, not written): 1 lines (Xid 161: 1)" in summary
    assert "fatal Xids naming no faultcast mode (not written" in summary

    assert cli.main([*argv, "--keep-unexplained", "--nodes", "gpu-0[8-9]"]) == 0
    assert [(r["node"], r["mode"], r["xid"]) for r in _read(out)] == [
        ("gpu-08", "detachment", "79"), ("gpu-08", "unknown", "46")]  # fmt: skip
    assert "on nodes outside --nodes: 1 lines" in capsys.readouterr().out


def test_a_bad_gpu_map_row_names_its_line(tmp_path: Path) -> None:
    gpus = tmp_path / "gpu-07.csv"
    gpus.write_text("index, pci.bus_id\n0, 00000000:3B:00.0\nzero, nowhere\n")
    with pytest.raises(KernelLogError, match=r"gpu-07\.csv:3: expected nvidia-smi"):
        GpuMap().read(gpus, "gpu-07")


# -- Slurm's text --------------------------------------------------------------------------------------

EVENTS_P = """NodeName|TimeStart|TimeEnd|State|Reason|User
gpu-08|2024-03-04T10:15:00|Unknown|DRAIN|Xid 79 fell off bus|root(0)
gpu-10|2024-03-04T11:00:00|2024-03-04T12:00:00|DOWN|Not responding|slurm(64030)
|2024-03-04T11:00:00|Unknown|||
gpu-11|2024-03-04T11:30:00|Unknown|DRAIN|faultcast alert 3: hbm_wear gpu 2 risk 0.91|root(0)
gpu-12|2024-03-04T12:00:00|Unknown|DRAIN|bad node | ticket 42|root(0)
"""
# sacctmgr's fixed-width table (its Cluster column left out to keep the lines short)
FIXED = """        NodeName           TimeStart             TimeEnd  State                         Reason       User
--------------- ------------------- ------------------- ------ ------------------------------ ----------
         gpu-08 2024-03-04T10:15:00             Unknown  DRAIN            Xid 79 fell off bus    root(0)
         gpu-10 2024-03-04T11:00:00 2024-03-04T12:00:00 DOWN*                  Not responding slurm(640+
"""


def test_sacctmgr_event_text_in_its_printed_shapes() -> None:
    def read(text: str) -> list[tuple[str, float, str]]:
        return [(e.node, e.time_s, e.reason) for e in parse_sacctmgr_events(text.splitlines(), "ev", UTC)]

    parsable = read(EVENTS_P)
    assert parsable[0] == ("gpu-08", T0 + 228, "Xid 79 fell off bus")
    assert [n for n, *_ in parsable] == ["gpu-08", "gpu-10", "gpu-11", "gpu-12"]  # the cluster event left out
    assert parsable[3][2] == "bad node | ticket 42"  # a reason holding "|"
    no_header = "\n".join(line + "|" for line in EVENTS_P.splitlines()[1:])  # -p -n: every field ends in "|"
    assert read(no_header) == parsable
    assert read(FIXED) == parsable[:2]
    with pytest.raises(SlurmEventError, match=r"ev:2: expected 6 '\|'-separated fields"):
        read("NodeName|TimeStart|TimeEnd|State|Reason|User\ngpu-1|2024-03-04T10:00:00\n")
    with pytest.raises(SlurmEventError, match=r"ev:1: 'yesterday' is not a Slurm time"):
        read("gpu-1|yesterday|Unknown|DOWN|x|root(0)\n")


@pytest.mark.parametrize(
    ("reason", "verdict", "mode"),
    [
        ("Xid 79", Verdict.FAILURE, "detachment"),
        ("xid:48 on GPU3", Verdict.FAILURE, "hbm_wear"),
        ("XID 13 from user job", Verdict.APPLICATION, ""),
        ("gpu fell off bus", Verdict.FAILURE, "detachment"),
        ("gres/gpu count reported lower than configured (7 < 8)", Verdict.FAILURE, "detachment"),
        ("NVLink errors on link 3", Verdict.FAILURE, "nvlink"),
        ("ECC errors, RMA", Verdict.FAILURE, "hbm_wear"),
        ("IB link down mlx5_2", Verdict.FAILURE, "infiniband"),
        ("GSP timeout", Verdict.FAILURE, "firmware"),
        ("NCCL watchdog timeout", Verdict.FAILURE, "nccl_timeout"),
        ("Kill task failed", Verdict.FAILURE, "host"),
        ("Not responding", Verdict.FAILURE, "host"),
        ("Node unexpectedly rebooted boot_time=1709547072", Verdict.FAILURE, "host"),
        ("faultcast alert 4711: hbm_wear gpu 3 risk 0.91", Verdict.PREDICTION, ""),
        ("Reboot ASAP", Verdict.PLANNED, ""),
        ("maintenance window", Verdict.PLANNED, ""),
        ("investigating", Verdict.UNEXPLAINED, ""),
    ],
)
def test_drain_reasons(reason: str, verdict: Verdict, mode: str) -> None:
    reading = ReasonRules().read(reason)
    assert (reading.verdict, reading.mode) == (verdict, mode)


def test_operator_reason_rules_come_first_and_are_checked() -> None:
    rules = ReasonRules([parse_rule("bad gpu=detachment"), parse_rule("burn-in=skip")])
    assert rules.read("Bad GPU 3").mode == FailureMode.DETACHMENT
    assert rules.read("burn-in after ECC swap").verdict is Verdict.PLANNED
    with pytest.raises(ValueError, match="not one of"):
        parse_rule("x=broken")
    with pytest.raises(ValueError, match="REGEX=MODE"):
        parse_rule("no mode")


def test_hostlists() -> None:
    assert expand_hostlist("gpu[01-03,07],login1") == ["gpu01", "gpu02", "gpu03", "gpu07", "login1"]
    with pytest.raises(ValueError, match="not a number"):
        expand_hostlist("gpu[a-b]")


def test_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = str(tmp_path / "f.csv")
    assert cli.main(["failures", "--out", out]) == 2
    assert "nothing to read" in capsys.readouterr().err
    assert cli.main(["failures", "--out", out, "--kernel-log", "x", "--timezone", "Mars/Olympus"]) == 2
    assert "is not a time zone" in capsys.readouterr().err
    assert cli.main(["failures", "--out", out, "--kernel-log", str(tmp_path / "missing.log")]) == 2
    assert "missing.log: No such file" in capsys.readouterr().err


# -- the log the importer reads --------------------------------------------------------------------------


def _export(nodes: tuple[str, ...], gpus: int, start_s: float, steps: int) -> dict[str, object]:
    result = [
        {
            "metric": {
                "__name__": "DCGM_FI_DEV_GPU_TEMP",
                "gpu": str(g),
                "UUID": f"GPU-{n}-{g}",
                "Hostname": n,
            },
            "values": [[start_s + 60 * i, str(40 + g)] for i in range(steps)],
        }
        for n in nodes
        for g in range(gpus)
    ]
    return {"status": "success", "data": {"resultType": "matrix", "result": result}}


def test_the_log_imports_and_opens(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log, gpus, events = tmp_path / "kern.log", tmp_path / "gpu-07.csv", tmp_path / "events.txt"
    log.write_text(f"Mar  4 10:11:12 gpu-07 kernel: {XID_48}\nMar  4 10:11:12 gpu-08 kernel: {XID_79}\n")
    gpus.write_text("index, pci.bus_id\n3, 00000000:CA:00.0\n")
    events.write_text(EVENTS_P.replace("gpu-10", "gpu-07"))
    out = tmp_path / "failures.csv"
    assert cli.main(["failures", "--out", str(out), "--kernel-log", str(log), "--gpu-map", str(gpus),
                     "--slurm-events", str(events), "--year", "2024", "--nodes", "gpu-0[7-8]"]) == 0  # fmt: skip
    summary = capsys.readouterr().out
    rows = _read(out)
    assert list(rows[0]) == list(FAILURE_FIELDS)
    assert [(r["node"], r["gpu"], r["mode"]) for r in rows] == [
        ("gpu-07", "3", "hbm_wear"), ("gpu-08", "", "detachment"), ("gpu-07", "", "host")]  # fmt: skip
    assert "also slurm" in rows[1]["description"]  # the drain on gpu-08 was the same fault
    assert "(1 of them the same fault as a kernel-log failure)" in summary
    export = tmp_path / "export.json"
    export.write_text(json.dumps(_export(("gpu-07", "gpu-08"), 8, T0 - 3600, 180)))
    data = tmp_path / "data"
    assert (
        cli.main(["import-prometheus", "--export", str(export), "--failures", str(out), "--out", str(data)])
        == 0
    )
    capsys.readouterr()
    imported = _read(data / "failures.csv")
    assert [(r["node"], r["gpu"], r["mode"], r["xid"]) for r in imported] == [
        (r["node"], r["gpu"], r["mode"], r["xid"]) for r in rows]  # fmt: skip
    assert imported[0]["uuid"] == "GPU-gpu-07-3"  # the importer fills the UUID from the telemetry
    dataset = open_dataset(data)
    assert len(dataset.failures) == 3
    assert dataset.failures.gpu.tolist() == [3, -1, -1]


def test_write_failures_writes_the_header_for_an_empty_log(tmp_path: Path) -> None:
    assert write_failures(tmp_path / "sub" / "f.csv", []) == 0
    assert (tmp_path / "sub" / "f.csv").read_text().strip() == ",".join(FAILURE_FIELDS)


# -- a real Slurm cluster ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster() -> Iterator[SlurmCluster]:
    yield from running_cluster(("fc-f1", "fc-f2", "fc-f3", "fc-f4"))


def test_from_slurm_reads_the_clusters_drain_and_down_reasons(
    cluster: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    reasons = {
        "fc-f1": ("DRAIN", "Xid 79 GPU fell off the bus"),
        "fc-f2": ("DOWN", "NVLink errors on link 3"),
        "fc-f3": ("DRAIN", "faultcast alert 7: hbm_wear gpu 3 risk 0.91"),
        "fc-f4": ("DRAIN", "investigating | ticket 42"),
    }
    # Slurm stamps a reason to the second; a DOWN node is also drained so that ReturnToService=2 cannot
    # bring it back when it next answers a ping.
    before = dt.datetime.now(dt.UTC).replace(microsecond=0)
    try:
        for node, (state, reason) in reasons.items():
            cluster.run("scontrol", "update", f"NodeName={node}", f"State={state}", f"Reason={reason}")
            if state == "DOWN":
                cluster.run("scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}")
        after = dt.datetime.now(dt.UTC)
        monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
        log = tmp_path / "fc-f1.dmesg"  # the node's own kernel log: the same fault, with its GPU
        moment = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
        log.write_text(f"[{moment.strftime('%a %b %d %H:%M:%S %Y')}] {XID_79}\n")
        out = tmp_path / "failures.csv"
        assert cli.main(["failures", "--out", str(out), "--from-slurm", "--kernel-log", str(log)]) == 0
        summary = capsys.readouterr().out
        rows = _read(out)
        assert [(r["node"], r["mode"], r["xid"]) for r in rows] == [("fc-f1", "detachment", "79"),
                                                                    ("fc-f2", "nvlink", "")]  # fmt: skip
        assert rows[0]["timestamp"] == moment.strftime("%Y-%m-%dT%H:%M:%SZ")  # the kernel log's, earlier
        assert "also slurm sinfo -R" in rows[0]["description"]
        assert "'NVLink errors on link 3' by root(0)" in rows[1]["description"]
        drained_at = dt.datetime.fromisoformat(rows[1]["timestamp"].replace("Z", "+00:00"))
        assert before <= drained_at <= after  # Slurm's stamp of the reason, read as UTC
        assert "skipped, faultcast's own drains (predictions, not failures): 1" in summary
        assert "'investigating | ticket 42' 1" in summary
        assert "AccountingStorageType=accounting_storage/none, no slurmdbd" in summary
    finally:
        for node in reasons:
            cluster.run("scontrol", "update", f"NodeName={node}", "State=RESUME", check=False)
