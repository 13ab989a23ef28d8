"""`faultcast import-prometheus --url`: a real Prometheus scraping a real `faultcast collect` every second,
read through its HTTP API at a 5 s step; the step summaries checked against the raw samples the server
holds, the fetch's own files and an export made by hand imported to the same rows, a fetch resumed
after an interruption and retried through a flaky proxy."""

from __future__ import annotations

import contextlib
import http.server
import io
import json
import math
import subprocess
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from faultcast.cli.app import main
from faultcast.model.features.offline import DataError
from faultcast.model.importers.fetch import Client, PrometheusError, parse_time, plan_queries
from faultcast.model.importers.prometheus import fetch_prometheus, import_prometheus
from faultcast.schemas import GPU_COLUMNS
from faultcast.step_summary import SCRAPES_COLUMN, SUMMARY_COLUMNS
from faultcast.testing.system import require_binary
from tests.prometheus_api import api, running_prometheus, until

FAULTCAST = str(Path(sys.executable).with_name("faultcast"))
NODE = "url-import-node"
STEP = 5.0
STEPS = 7  # evaluation times in the window
GPUS = 2
RAW = {  # summarised gauges the collector exports, by series name, and their catalogue column
    "DCGM_FI_DEV_GPU_TEMP": "gpu_temp",
    "DCGM_FI_DEV_POWER_USAGE": "power_usage",
    "DCGM_FI_DEV_SM_CLOCK": "sm_clock",
}


@dataclass(frozen=True)
class Server:
    port: int
    since: float  # a multiple of STEP
    until: float  # since + (STEPS - 1) * STEP, in the past: every sample of the window is stored

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    require_binary("prometheus")
    where = tmp_path_factory.mktemp("prometheus")
    collector = subprocess.Popen(
        [FAULTCAST, "collect", "--source", "simulated", "--node", NODE, "--gpus", str(GPUS),
         "--prometheus-address", "127.0.0.1", "--prometheus-port", "0", "--interval", "1s",
         "--duration", "600s"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert collector.stdout is not None
        line = collector.stdout.readline()
        assert "serving /metrics" in line, line
        target = int(line.rsplit(":", 1)[1].split("/")[0])
        config = where / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
            "scrape_configs:\n  - job_name: faultcast\n    static_configs:\n"
            f"      - targets: ['127.0.0.1:{target}']\n"
        )
        with running_prometheus(config, where) as port:
            first = until(lambda: _first_sample(port), "the first scrape")
            since = math.ceil((first + STEP + 1) / STEP) * STEP  # the first step's span holds scrapes only
            end = since + (STEPS - 1) * STEP
            until(lambda: _newest(port) > end + 2, "samples past the window's end", timeout=120)
            yield Server(port, since, end)
    finally:
        collector.terminate()
        collector.wait(timeout=30)


def _first_sample(port: int) -> float | None:
    result = api(port, "query", query="DCGM_FI_DEV_GPU_TEMP[10m]")["result"]
    return min(float(s["values"][0][0]) for s in result) if result else None


def _newest(port: int) -> float:
    result = api(port, "query", query="min(timestamp(DCGM_FI_DEV_GPU_TEMP))")["result"]
    return float(result[0]["value"][1]) if result else 0.0


def _raw(port: int, name: str, at: float) -> dict[int, list[tuple[float, float]]]:
    """The raw samples of a series name per GPU, over the 10 minutes before `at`."""
    result = api(port, "query", query=f'{name}{{Hostname="{NODE}"}}[10m]', time=str(at))["result"]
    return {int(s["metric"]["gpu"]): [(float(t), float(v)) for t, v in s["values"]] for s in result}


def _rows(frame: pd.DataFrame) -> list[dict[str, Any]]:
    return [{str(k): v for k, v in row.items()} for row in frame.to_dict("records")]


def _telemetry(out: Path) -> pd.DataFrame:
    frame = pq.read_table(out / "telemetry.parquet").to_pandas()
    frame["t"] = frame["timestamp"].astype("int64") / 1e9
    ordered: pd.DataFrame = frame.sort_values(["t", "gpu"]).reset_index(drop=True)
    return ordered


@pytest.fixture(scope="module")
def url_import(server: Server, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("url") / "data"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main(
            ["import-prometheus", "--url", server.url, "--since", str(server.since), "--until", str(server.until),
             "--step", "5s", "--points", "3", "--out", str(out)]
        )  # fmt: skip
    assert code == 0
    (out.parent / "printed.txt").write_text(printed.getvalue())
    return out


def test_step_summaries_are_those_of_the_raw_samples(server: Server, url_import: Path) -> None:
    frame = _telemetry(url_import)
    assert sorted(frame["t"].unique()) == [server.since + k * STEP for k in range(STEPS)]
    assert sorted(frame["gpu"].unique()) == list(range(GPUS))
    assert frame[SCRAPES_COLUMN].between(4, 6).all(), frame[SCRAPES_COLUMN].tolist()
    checked = 0
    for name, column in RAW.items():
        raw = _raw(server.port, name, server.until + 1)
        for row in _rows(frame):
            t, samples = float(row["t"]), raw[int(row["gpu"])]
            if any(abs(s - (t - STEP)) < 1e-6 or abs(s - t) < 1e-6 for s, _ in samples):
                continue  # on the window's edge: Prometheus 2 and 3 disagree on including it
            inside = [v for s, v in samples if t - STEP < s <= t]
            last = [v for s, v in samples if s <= t][-1]
            assert row[column] == pytest.approx(last, rel=1e-6), (name, t)
            assert row[f"{column}_step_min"] == pytest.approx(min(inside), rel=1e-6)
            assert row[f"{column}_step_max"] == pytest.approx(max(inside), rel=1e-6)
            assert row[f"{column}_step_mean"] == pytest.approx(np.mean(inside), rel=1e-6)
            if name == "DCGM_FI_DEV_GPU_TEMP":  # the scrapes are counted on the first summarised name
                assert row[SCRAPES_COLUMN] == len(inside)
            checked += 1
    assert checked >= len(RAW) * GPUS * (STEPS - 2)
    printed = (url_import.parent / "printed.txt").read_text()
    assert "step summaries (min/max/mean over each 5 s step) of: DCGM_FI_DEV_GPU_TEMP" in printed
    assert f"step summaries (each step's min, max, mean and scrapes) on {GPUS} GPUs: gpu_temp" in printed
    manifest = json.loads((url_import / "manifest.json").read_text())
    assert manifest["config"]["cadence_s"] == STEP
    assert manifest["step_summaries"]["gpus"] == dict.fromkeys(
        sorted([SCRAPES_COLUMN, *SUMMARY_COLUMNS]), GPUS
    )


def _same_files(a: Path, b: Path) -> None:
    """Equal data files, schema and values (NaN where NaN)."""
    for name in ("telemetry.parquet", "network.parquet"):
        left, right = pq.read_table(a / name), pq.read_table(b / name)
        assert left.schema == right.schema
        pd.testing.assert_frame_equal(left.to_pandas(), right.to_pandas())


def test_the_fetched_files_and_a_hand_made_export_give_the_same_rows(
    server: Server, url_import: Path, tmp_path: Path
) -> None:
    again = tmp_path / "again"
    import_prometheus(url_import / "prometheus-export", None, again, cadence_s=STEP)
    _same_files(again, url_import)

    # What an operator exports by hand: one query_range answer per name at the step, no summaries.
    names = api(server.port, "label/__name__/values")
    answers = []
    for name in names:
        if name.startswith(("DCGM_FI_", "faultcast_")):
            answers.append(
                {"status": "success",
                 "data": api(server.port, "query_range", query=name, start=str(server.since),
                             end=str(server.until), step="5")}
            )  # fmt: skip
    export = tmp_path / "export.json"
    export.write_text(json.dumps(answers))
    by_hand = tmp_path / "by-hand"
    import_prometheus(export, None, by_hand, cadence_s=STEP)
    url_rows, hand_rows = _telemetry(url_import), _telemetry(by_hand)
    assert SCRAPES_COLUMN not in hand_rows.columns
    pd.testing.assert_frame_equal(url_rows[["t", "gpu", *GPU_COLUMNS]], hand_rows[["t", "gpu", *GPU_COLUMNS]])


def test_throttle_summaries_from_the_bitmask_of_a_plain_dcgm_exporter(server: Server, tmp_path: Path) -> None:
    folder = tmp_path / "fetch"
    # As if the exporter had dcgm-exporter's names alone: the flags come from the bitmask's bits.
    report = fetch_prometheus(
        server.url, server.since, server.until, STEP, folder, keep=lambda name: name.startswith("DCGM_FI_")
    )
    assert {"faultcast_throttle_hw_power_brake", "DCGM_FI_DEV_GPU_TEMP"} <= set(report.summarised)
    assert not any(name.startswith("faultcast_") for name in report.summarised if "throttle" not in name)
    out = tmp_path / "data"
    import_prometheus(folder, None, out, cadence_s=STEP)
    frame = _telemetry(out)
    mask = _raw(server.port, "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", server.until + 1)
    for flag, bit in (
        ("throttle_hw_power_brake", 0x80),
        ("throttle_hw_slowdown", 0x08),
        ("throttle_sw_thermal", 0x20),
    ):
        for row in _rows(frame):
            # The subquery picks, at each second of the step, the newest scrape: a superset of the step's
            # scrapes reaches back at most one scrape before it.
            t = float(row["t"])
            near = [int(v) & bit != 0 for s, v in mask[int(row["gpu"])] if t - STEP - 2 < s <= t]
            low, high, mean = (float(row[f"{flag}_step_{s}"]) for s in ("min", "max", "mean"))
            assert 0 <= low <= mean <= high <= 1
            if near and all(near):
                assert low == 1
            if near and not any(near):
                assert high == 0
    assert set(SUMMARY_COLUMNS) <= set(frame.columns)


class _Proxy(http.server.ThreadingHTTPServer):
    """Forwards /api/v1 calls to Prometheus, counting query_range calls and failing the ones asked; a
    range query of more than `widest` points is refused as Prometheus refuses one over its
    --query.max-samples."""

    def __init__(self, target: str, fail: set[int]) -> None:
        self.target, self.fail, self.calls = target, fail, 0
        self.widest: int | None = None
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _Forward)


class _Forward(http.server.BaseHTTPRequestHandler):
    server: _Proxy

    def do_GET(self) -> None:
        self.do_POST()

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        with self.server.lock:
            if self.path.endswith("/query_range"):
                self.server.calls += 1
                failing = self.server.calls in self.server.fail
            else:
                failing = False
        if self.path.endswith("/query_range") and body and self.server.widest is not None:
            form = urllib.parse.parse_qs(body.decode())
            points = round((float(form["end"][0]) - float(form["start"][0])) / float(form["step"][0])) + 1
            if points > self.server.widest:
                self.send_response(422)
                self.end_headers()
                self.wfile.write(
                    b'{"status":"error","errorType":"execution","error":"query processing would load too many '
                    b'samples into memory in query execution"}'
                )
                return
        if failing:
            self.send_response(503)
            self.end_headers()
            self.wfile.write(b'{"status":"error","error":"injected"}')
            return
        url = self.server.target + self.path  # http://127.0.0.1:<prometheus>
        request = urllib.request.Request(url, data=body, headers=dict(self.headers))  # noqa: S310
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310
            payload = response.read()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def proxy(server: Server) -> Iterator[_Proxy]:
    proxy = _Proxy(server.url, set())
    thread = threading.Thread(target=proxy.serve_forever, daemon=True)
    thread.start()
    yield proxy
    proxy.shutdown()
    proxy.server_close()


def test_a_fetch_retries_and_resumes_after_an_interruption(
    server: Server, url_import: Path, proxy: _Proxy, tmp_path: Path
) -> None:
    url = f"http://127.0.0.1:{proxy.server_address[1]}"
    folder = tmp_path / "fetch"
    waits: list[float] = []
    # The second range query fails once (retried); from the 16th every attempt fails: the fetch stops.
    proxy.fail = {2, *range(16, 1000)}
    with pytest.raises(PrometheusError, match="gave up after 3 attempts"):
        fetch_prometheus(url, server.since, server.until, STEP, folder, points=3,
                         client=Client(url, attempts=3, sleep=waits.append))  # fmt: skip
    assert waits == [1.0, 1.0, 2.0]  # one retry after the first failure; two before giving up
    kept = sorted(folder.glob("*.json"))
    assert not list(folder.glob("*.partial"))

    proxy.fail, proxy.calls = set(), 0
    report = fetch_prometheus(url, server.since, server.until, STEP, folder, points=3, client=Client(url))
    probes = report.probes  # one range query per summarisable name, before the answers
    assert len(kept) == 15 - 1 - probes  # the answers of the calls that succeeded before the stop
    assert report.answers_reused == len(kept) > 0
    assert proxy.calls == probes + report.answers_fetched  # only what was missing was asked again
    out = tmp_path / "data"
    import_prometheus(folder, None, out, cadence_s=STEP)
    _same_files(out, url_import)


def test_a_chunk_the_server_finds_too_big_is_halved(
    server: Server, url_import: Path, proxy: _Proxy, tmp_path: Path
) -> None:
    url = f"http://127.0.0.1:{proxy.server_address[1]}"
    proxy.widest = 2  # the server's sample limit allows 2 points of a query, not 7
    folder = tmp_path / "fetch"
    report = fetch_prometheus(url, server.since, server.until, STEP, folder, client=Client(url))
    assert report.splits > 0
    out = tmp_path / "data"
    import_prometheus(folder, None, out, cadence_s=STEP)
    _same_files(out, url_import)


def test_a_wide_fleet_gets_fewer_points_an_answer(server: Server, url_import: Path, tmp_path: Path) -> None:
    folder = tmp_path / "fetch"
    fetch_prometheus(server.url, server.since, server.until, STEP, folder, per_answer=2 * GPUS)
    temperature: list[int] = []
    for answer in folder.glob("*.json"):
        result = json.loads(answer.read_text())["data"]["result"]
        points = [len(series["values"]) for series in result]
        # At most 2 x GPUS samples an answer, or one point a series where a name has more series.
        assert sum(points) <= 2 * GPUS or max(points) == 1, (answer.name, points)
        if result and result[0]["metric"]["__name__"] == "DCGM_FI_DEV_GPU_TEMP":
            temperature += points
    assert max(temperature) == 2  # two GPUs: two points each an answer, not seven
    out = tmp_path / "data"
    import_prometheus(folder, None, out, cadence_s=STEP)
    _same_files(out, url_import)


def test_a_moved_window_reuses_the_spans_it_shares(server: Server, url_import: Path, tmp_path: Path) -> None:
    folder = tmp_path / "fetch"
    first = fetch_prometheus(server.url, server.since, server.until - STEP, STEP, folder, points=3)
    again = fetch_prometheus(server.url, server.since, server.until, STEP, folder, points=3)
    assert again.answers_reused > 0  # the spans before the moved end are the ones fetched before
    assert again.answers_fetched < first.answers_fetched + first.answers_reused
    out = tmp_path / "data"
    import_prometheus(folder, None, out, cadence_s=STEP)
    _same_files(out, url_import)  # nothing of the first window's last span is left behind
    with pytest.raises(DataError, match=r"holds a fetch of url=.* step=5s, not .* step=10s"):
        fetch_prometheus(server.url, server.since, server.until, 2 * STEP, folder)


def test_a_folder_that_is_not_a_fetch_is_never_emptied(server: Server, tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "keep.json").write_text("{}")
    with pytest.raises(DataError, match="is not empty and holds no fetch"):
        fetch_prometheus(server.url, server.since, server.until, STEP, mine)
    assert (mine / "keep.json").read_text() == "{}"


def test_every_vocabulary_gets_its_scrapes_and_every_bitmask_its_flags() -> None:
    names = ["DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
             "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_GPU_TEMP_CELSIUS", "faultcast_throttle_hw_slowdown"]  # fmt: skip
    summarised = {"DCGM_FI_DEV_GPU_TEMP": "gpu_temp", "DCGM_FI_DEV_GPU_TEMP_CELSIUS": "gpu_temp",
                  "faultcast_throttle_hw_slowdown": "throttle_hw_slowdown"}  # fmt: skip
    masks = ["DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"]
    queries = plan_queries(names, 60.0, dict.fromkeys(names, 10.0), summarised,
                           {"faultcast_throttle_hw_slowdown": 8}, masks)  # fmt: skip
    counted = {q.name for q in queries if q.stat == "scrapes"}
    assert counted == set(summarised)  # a GPU behind either name has its scrapes counted
    from_bits = [q for q in queries if q.source in masks and q.stat is not None]
    assert {q.source for q in from_bits} == set(masks)
    assert all("[59999ms:10s]" in q.expr for q in from_bits)  # (t - step, t] on Prometheus 2 and 3
    own = [i for i, q in enumerate(queries) if q.reads == "faultcast_throttle_hw_slowdown" and q.stat]
    assert max(i for i, q in enumerate(queries) if q in from_bits) < min(own)  # the flag's own wins
    assert all(q.expr.startswith("last_over_time(") for q in queries if q.stat is None)


def test_url_errors_are_one_line(server: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dead = f"http://127.0.0.1:{_closed_port()}"
    code = main(["import-prometheus", "--url", dead, "--since", "60", "--until", "600", "--attempts", "1",
                 "--out", str(tmp_path / "o")])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1, err
    assert "gave up after 1 attempts" in err
    code = main(
        ["import-prometheus", "--url", server.url, "--since", "yesterday-ish", "--out", str(tmp_path / "o")]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1, err
    assert "is not a time" in err


def _closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_unreachable_is_retried_not_waited_for_ever(tmp_path: Path) -> None:
    waits: list[float] = []
    client = Client(f"http://127.0.0.1:{_closed_port()}", attempts=4, sleep=waits.append)
    with pytest.raises(PrometheusError, match="gave up after 4 attempts"):
        client.call("label/__name__/values", {})
    assert waits == [1.0, 2.0, 4.0]  # the waits were asked of `sleep`, not slept
    with pytest.raises(DataError, match="expected http"):
        Client("file:///etc/passwd")


def test_credentials_in_the_url_are_sent_and_never_shown() -> None:
    client = Client(f"http://alice:s3cret@127.0.0.1:{_closed_port()}/prom/", attempts=1)
    assert "s3cret" not in client.shown
    assert client.shown.endswith("/prom")
    with pytest.raises(PrometheusError) as refused:
        client.call("label/__name__/values", {})
    assert "s3cret" not in str(refused.value)
    assert "alice" not in str(refused.value)


@pytest.mark.parametrize("text", ["nan", "inf", "1e400", "-5", "-99999999999999"])
def test_a_time_outside_1970_to_3000_is_refused(text: str) -> None:
    with pytest.raises(DataError, match="is not a time between 1970 and 3000"):
        parse_time(text)


class _CutShort(http.server.BaseHTTPRequestHandler):
    """Promises a longer body than it sends, then hangs up."""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "1000")
        self.end_headers()
        self.wfile.write(b'{"status":"success","data":[')

    def log_message(self, *args: Any) -> None:
        pass


def test_a_body_cut_short_is_retried_then_reported() -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _CutShort)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        waits: list[float] = []
        client = Client(f"http://127.0.0.1:{server.server_address[1]}", attempts=2, sleep=waits.append)
        with pytest.raises(PrometheusError, match="gave up after 2 attempts"):
            client.call("label/__name__/values", {})
        assert waits == [1.0]
    finally:
        server.shutdown()
        server.server_close()
