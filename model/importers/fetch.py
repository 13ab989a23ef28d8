"""Reading a running Prometheus through its HTTP API into export files `import_prometheus` reads.

`fetch` asks the server which metric names it holds in the window, keeps those the importer knows,
and runs one `query_range` per name at the grid's step, chunked to the server's limit of points per
series (11,000), retried on connection errors, 429 and 5xx, and split in halves when the server says
a chunk would load too many samples. Every answer is written whole (through a temporary file and a
rename) as `NNN-CCCCC-<hash>.json` in the fetch directory: a rerun after an interruption skips the
answers already there, so a fetch resumes where it stopped. The directory is an ordinary export:
`import-prometheus --export DIR` reads it again and gives the same rows.

Step summaries: the model reads, for a few gauges (faultcast.step_summary.SUMMARISED), the minimum,
maximum and mean over the scrapes inside each step, and how many there were. Where the raw series is
finer than the step (two or more scrapes per step somewhere in the window), they are asked of the
server as `min_over_time`, `max_over_time`, `avg_over_time` and `count_over_time` over the step and
written under the series' own name with the label `faultcast_step` = min, max, mean or scrapes
(STEP_LABEL), which the importer lays into the summary columns. The throttle flags of a plain
dcgm-exporter live in the clock-event-reasons bitmask: their summaries come from the bit
(`floor(x / bit) % 2`) through a subquery at the raw scrape interval. Each answer at time t covers
the step (t - step, t], the same span the last value at t closes.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import http.client
import json
import logging
import math
import os
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from faultcast.model.features.offline import DataError

log = logging.getLogger(__name__)

STEP_LABEL = "faultcast_step"
"""The label that marks a step summary series in an export: min, max, mean or scrapes."""
STEP_STATS = ("min", "max", "mean", "scrapes")
MAX_POINTS = 11_000
"""Prometheus refuses a range query of more points per series than this."""
PER_ANSWER = 1_000_000
"""The most samples (series x points) asked in one answer: an answer is parsed whole in memory, so a
wide fleet's queries get fewer points each (about 150 MiB of Python objects at this size)."""
DESCRIPTION = "fetch.txt"
"""The fetch directory's note of what it holds (not .json: the import reads only those)."""
_OVER_TIME = {"min": "min_over_time", "max": "max_over_time", "mean": "avg_over_time"}
_TOO_MANY = "too many samples"


class PrometheusError(DataError):
    """The server refused a query, or could not be reached after every retry."""


@dataclass(frozen=True)
class Query:
    """One range query of the fetch and how its answer is labelled."""

    expr: str
    name: str  # the series' __name__ in the written answer
    stat: str | None = None  # a STEP_STATS entry for a summary, None for the raw series
    source: str = ""  # the metric name the query reads, when not `name` (a bitmask's flags)

    @property
    def reads(self) -> str:
        return self.source or self.name


@dataclass
class FetchReport:
    """What a fetch did."""

    folder: Path
    queries: int = 0
    answers_fetched: int = 0
    answers_reused: int = 0  # already in the folder from an interrupted run
    retries: int = 0
    splits: int = 0  # chunks halved because the server would load too many samples
    series: int = 0
    summarised: list[str] = field(default_factory=list)  # names written with step summaries
    coarse: list[str] = field(default_factory=list)  # summarisable names no finer than the step
    probes: int = 0  # range queries asking how finely a name is scraped


class Client:
    """GET/POST on a Prometheus's /api/v1, with retries."""

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 60.0,
        attempts: int = 5,
        backoff_s: float = 1.0,
        sleep: Callable[[float], None] = time.sleep,
        bearer_token: str | None = None,
    ) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise DataError(
                "--url: expected http(s)://[user:password@]host:port[/prefix] of a Prometheus server"
            )
        if attempts < 1:
            raise ValueError(f"attempts must be at least 1, got {attempts}")
        host = parts.hostname + (f":{parts.port}" if parts.port else "")
        host = f"[{host}]" if ":" in parts.hostname and not host.startswith("[") else host
        self.base = urllib.parse.urlunsplit((parts.scheme, host, parts.path.rstrip("/"), "", ""))
        self.shown = self.base  # credentials never appear in messages, logs or files
        self._headers = {"Accept": "application/json"}
        if (
            parts.username is not None
        ):  # basic auth from the URL, as curl and Prometheus's own clients take it
            pair = f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
            self._headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
        if bearer_token:
            self._headers["Authorization"] = f"Bearer {bearer_token}"
        self.timeout_s, self.attempts, self.backoff_s, self._sleep = timeout_s, attempts, backoff_s, sleep
        self.retries = 0

    def call(self, path: str, params: dict[str, str]) -> Any:
        """The `data` of /api/v1/PATH (a POST for queries, whose text may be long; a GET otherwise);
        PrometheusError on a refusal or when every attempt failed."""
        form = urllib.parse.urlencode(params)
        if path in ("query", "query_range"):
            request = urllib.request.Request(  # noqa: S310 (http or https: checked in __init__)
                f"{self.base}/api/v1/{path}",
                data=form.encode(),
                headers={**self._headers, "Content-Type": "application/x-www-form-urlencoded"},
            )
        else:
            request = urllib.request.Request(f"{self.base}/api/v1/{path}?{form}", headers=self._headers)  # noqa: S310
        last = ""
        for attempt in range(self.attempts):
            if attempt:
                self.retries += 1
                self._sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as response:  # noqa: S310
                    answer = json.load(response)
            except urllib.error.HTTPError as exc:
                error = _error_of(exc)
                if exc.code == 429 or exc.code >= 500:
                    last = f"HTTP {exc.code}: {error}"
                    continue
                raise PrometheusError(f"{self.shown}: {path} refused (HTTP {exc.code}): {error}") from exc
            except (
                OSError,
                ValueError,
                http.client.HTTPException,
            ) as exc:  # URLError, timeouts, resets, a cut-off body
                last = str(getattr(exc, "reason", exc))
                continue
            if not isinstance(answer, dict) or answer.get("status") != "success":
                raise PrometheusError(f"{self.shown}: {path} answered {str(answer)[:300]}")
            return answer.get("data")
        raise PrometheusError(
            f"{self.shown}: {path}: gave up after {self.attempts} attempts; the last: {last}"
        )


def _error_of(exc: urllib.error.HTTPError) -> str:
    try:
        answer = json.loads(exc.read())
        return str(answer.get("error", answer))
    except (OSError, ValueError, AttributeError):
        return exc.reason if isinstance(exc.reason, str) else str(exc)


def parse_time(text: str, *, now: float | None = None) -> float:
    """Unix seconds from unix seconds, an ISO 8601 time (UTC when it names no zone), `now`, or a
    duration before now (`7d`, `36h`)."""
    from faultcast.durations import DurationError, parse_duration

    now = time.time() if now is None else now
    text = text.strip()
    if text == "now":
        return now
    try:
        number: float | None = float(text)
    except ValueError:
        number = None
    if number is not None:
        return _in_range(text, number)
    try:
        ago = parse_duration(text)
    except DurationError:
        ago = None
    if ago is not None:
        return _in_range(text, now - ago)
    try:
        moment = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise DataError(
            f"{text!r} is not a time: give unix seconds, an ISO 8601 time, `now`, or a duration ago (7d)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return _in_range(text, moment.timestamp())


def _in_range(text: str, seconds: float) -> float:
    if not (math.isfinite(seconds) and 0 <= seconds < 32_503_680_000):  # 1970 to 3000
        raise DataError(f"{text!r} is not a time between 1970 and 3000")
    return seconds


def _duration(seconds: float) -> str:
    """A PromQL duration: whole seconds when it is one, else milliseconds."""
    ms = round(seconds * 1000)
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def plan_queries(
    names: Sequence[str],
    step_s: float,
    scrape_s: dict[str, float],
    summarised: dict[str, str],
    flag_bits: dict[str, int],
    bitmask_names: Sequence[str],
) -> list[Query]:
    """The fetch's range queries: every name raw (its last sample in each step); for each name that
    maps to a summarised gauge (`summarised`: series name -> its catalogue name) and is finer than the
    step (`scrape_s` holds its raw interval), its min, max, mean and count over each step (the count
    on every such name: a fleet mixing exporters' vocabularies has GPUs behind each); and the throttle
    flags' summaries (`flag_bits`: the flag's series name -> its bit) from every bitmask name, placed
    before the flags' own summaries so that a GPU exporting both keeps its own."""
    window = _window(step_s)
    queries = [Query(f"last_over_time({name}[{window}])", name, source=name) for name in names]
    for mask in bitmask_names:
        if mask not in scrape_s:
            continue
        resolution = _duration(scrape_s[mask])
        for flag, bit in flag_bits.items():
            bit_expr = f"(floor({mask} / {bit}) % 2)[{window}:{resolution}]"
            for stat, function in _OVER_TIME.items():
                queries.append(Query(f"{function}({bit_expr})", flag, stat, source=mask))
    for name in names:
        if name not in summarised or name not in scrape_s:
            continue
        for stat, function in _OVER_TIME.items():
            queries.append(Query(f"{function}({name}[{window}])", name, stat))
        queries.append(Query(f"count_over_time({name}[{window}])", name, "scrapes"))
    return queries


def _window(step_s: float) -> str:
    """The range of one step: a millisecond short of it, so that the step (t - step, t] is read alike
    by Prometheus 2, whose ranges are closed at both ends, and 3, whose are open on the left."""
    return _duration(step_s - 0.001)


def _chunks(start: float, end: float, step_s: float, points: int) -> list[tuple[float, float]]:
    """[start, end] cut into spans of at most `points` evaluation times `step_s` apart, on a grid of
    spans aligned to the epoch: a window that moved keeps the spans it shares with the one before
    (a rerun of `--since 7d` reuses every whole span already fetched)."""
    out = []
    first, last = round(start / step_s), round(end / step_s)
    k = first
    while k <= last:
        span_end = min(last, (k // points + 1) * points - 1)
        out.append((k * step_s, span_end * step_s))
        k = span_end + 1
    return out


def fetch(
    url: str,
    since: float,
    until: float,
    step_s: float,
    folder: Path,
    *,
    known: Callable[[str], bool],
    summarised: dict[str, str],
    flag_bits: dict[str, int],
    bitmask_names: Sequence[str],
    points: int = MAX_POINTS,
    per_answer: int = PER_ANSWER,
    client: Client | None = None,
) -> FetchReport:
    """Write the range queries' answers for [since, until] at `step_s` into `folder` (created) and
    say what was done; `known(name)` picks the metric names to fetch. Raises DataError on bad
    arguments, PrometheusError when the server refuses or cannot be reached."""
    if not (step_s > 0 and math.isfinite(step_s)):
        raise DataError(f"--step must be a positive number of seconds, got {step_s}")
    if not 1 <= points <= MAX_POINTS:
        raise DataError(f"points per query must be 1..{MAX_POINTS}, got {points}")
    if abs(step_s * 1000 - round(step_s * 1000)) > 1e-6 or step_s < 0.002:
        raise DataError(f"--step must be a whole number of milliseconds, 2 ms or more, got {step_s} s")
    start, end = math.ceil(since / step_s) * step_s, math.floor(until / step_s) * step_s
    if not end >= start:
        raise DataError(f"--since must be at least one --step ({step_s:g} s) before --until")
    client = client or Client(url)
    _claim(folder, client.shown, step_s)
    window = {"start": _number(start), "end": _number(end)}
    listed = client.call("label/__name__/values", window) or []
    names = sorted(name for name in listed if isinstance(name, str) and known(name))
    if not names:
        shown = ", ".join(str(n) for n in listed[:8]) or "none"
        raise PrometheusError(
            f"{client.shown}: no metric the import knows between {_iso(start)} and {_iso(end)} "
            f"(DCGM_FI_DEV_GPU_TEMP, ...); names there: {shown}"
        )
    report = FetchReport(folder)
    candidates = [n for n in names if n in summarised or n in bitmask_names]
    scrape_s = _scrape_intervals(client, candidates, start, end, step_s, report)
    report.probes = len(candidates)
    report.coarse = sorted(n for n in candidates if n not in scrape_s)
    queries = plan_queries(names, step_s, scrape_s, summarised, flag_bits, bitmask_names)
    report.summarised = sorted({q.name for q in queries if q.stat is not None})
    report.queries = len(queries)
    width = {name: _series_count(client, name, window) for name in sorted({q.reads for q in queries})}
    wanted: set[str] = set()
    kept = {m.group(2): path for path in folder.iterdir() if (m := _ANSWER.match(path.name))}
    for q, query in enumerate(queries):
        most = min(points, max(1, per_answer // max(1, width[query.reads])))
        for a, b in _chunks(start, end, step_s, most):
            digest = hashlib.sha256(f"{query.expr}|{a}|{b}|{step_s}".encode()).hexdigest()[:12]
            target = folder / f"{q:03d}-{round(a):011d}-{digest}.json"  # file order: query, then time
            wanted.add(target.name)
            if digest in kept:
                if kept[digest] != target:
                    kept[digest].replace(target)  # the same answer, the query at another place
                report.answers_reused += 1
                continue
            result = _range(client, query.expr, a, b, step_s, report)
            for series in result:
                labels = series.setdefault("metric", {})
                labels["__name__"] = query.name
                if query.stat is not None:
                    labels[STEP_LABEL] = query.stat
            report.series += len(result)
            _write_answer(target, result)
            report.answers_fetched += 1
    for path in folder.iterdir():
        if (_ANSWER.match(path.name) and path.name not in wanted) or path.suffix == ".partial":
            path.unlink()  # this folder's answers of another window, or one cut short
    report.retries = client.retries
    log.info(
        "fetched %d answers (%d reused) of %d queries from %s",
        report.answers_fetched,
        report.answers_reused,
        report.queries,
        client.shown,
    )
    return report


_ANSWER = re.compile(r"^(\d{3})-\d{11}-([0-9a-f]{12})\.json$")
"""A fetch folder's answer file: query, first evaluation time, digest of the query and its span."""


def _claim(folder: Path, server: str, step_s: float) -> None:
    """Make `folder` this fetch's: created, or one that holds a fetch of the same server and step
    (whatever its window: answers of the same spans are reused, the others removed at the end).
    DataError for a folder that holds anything else, or another server's or step's answers."""
    about = f"url={server} step={step_s:g}s\n"
    note = folder / DESCRIPTION
    if folder.exists() and not folder.is_dir():
        raise DataError(f"--fetch-dir {folder}: a file, not a directory")
    if note.exists():
        if note.read_text() != about:
            raise DataError(
                f"--fetch-dir {folder} holds a fetch of {note.read_text().strip()}, not {about.strip()}: "
                "remove it or give another --fetch-dir"
            )
    elif folder.exists() and any(folder.iterdir()):
        raise DataError(f"--fetch-dir {folder} is not empty and holds no fetch: give an empty or new folder")
    folder.mkdir(parents=True, exist_ok=True)
    note.write_text(about)


def _series_count(client: Client, name: str, window: dict[str, str]) -> int:
    """How many series of this name the window holds (from the index: no samples are read)."""
    listed = client.call("series", {"match[]": name, **window}) or []
    return len(listed)


def _scrape_intervals(
    client: Client, names: Sequence[str], start: float, end: float, step_s: float, report: FetchReport
) -> dict[str, float]:
    """For each name whose raw series has two scrapes or more in some step of the window, its raw
    scrape interval (the step over the most scrapes a step held), from one range query per name at a
    step coarse enough for one query (a sample of the window's steps)."""
    out: dict[str, float] = {}
    coarse_step = max(step_s, math.ceil((end - start) / (MAX_POINTS - 1) / step_s) * step_s)
    for name in names:
        expr = f"max(count_over_time({name}[{_window(step_s)}]))"
        result = _range(client, expr, start, end, coarse_step, report)
        most = max((float(v) for s in result for _, v in s.get("values", [])), default=0.0)
        if most >= 2:
            out[name] = step_s / most
    return out


def _range(client: Client, expr: str, a: float, b: float, step_s: float, report: FetchReport) -> list[Any]:
    """The result of one range query over [a, b], halving the span while the server says it would
    load too many samples."""
    try:
        data = client.call(
            "query_range", {"query": expr, "start": _number(a), "end": _number(b), "step": _number(step_s)}
        )
    except PrometheusError as exc:
        if _TOO_MANY not in str(exc) or b - a < step_s:
            raise
        report.splits += 1
        middle = a + math.floor((b - a) / step_s / 2) * step_s
        return _merge(
            _range(client, expr, a, middle, step_s, report),
            _range(client, expr, middle + step_s, b, step_s, report),
        )
    if not isinstance(data, dict) or data.get("resultType") != "matrix":
        raise PrometheusError(f"{client.shown}: {expr!r} did not answer a matrix: {str(data)[:200]}")
    result: list[Any] = data.get("result", [])
    return result


def _merge(first: list[Any], second: list[Any]) -> list[Any]:
    """Two halves' results as one: a series in both gets the values of both, in time order."""
    out: dict[str, dict[str, Any]] = {}
    for series in [*first, *second]:
        key = json.dumps(series.get("metric", {}), sort_keys=True)
        if key in out:
            out[key]["values"] = out[key].get("values", []) + series.get("values", [])
        else:
            out[key] = dict(series)
    return list(out.values())


def _write_answer(target: Path, result: list[Any]) -> None:
    answer = {"status": "success", "data": {"resultType": "matrix", "result": result}}
    partial = target.with_suffix(".partial")
    with partial.open("w", encoding="utf-8") as handle:
        json.dump(answer, handle, separators=(",", ":"))
        handle.flush()
        os.fsync(handle.fileno())
    partial.replace(target)


def _number(seconds: float) -> str:
    return f"{seconds:.3f}".rstrip("0").rstrip(".")


def _iso(seconds: float) -> str:
    return dt.datetime.fromtimestamp(seconds, tz=dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
