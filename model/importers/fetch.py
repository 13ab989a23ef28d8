"""Reading a running Prometheus through its HTTP API into export files `import_prometheus` reads.

`fetch` asks the server which metric names it holds in the window, keeps those the importer knows,
and runs one `query_range` per name at the grid's step, chunked to the server's limit of points per
series (11,000), retried on connection errors, 429 and 5xx, and split in halves when the server says
a chunk would load too many samples. Every answer is written whole (through a temporary file and a
rename) as `NNN-CCCCC-<hash>.json` in the fetch directory: a rerun after an interruption skips the
answers already there, so a fetch resumes where it stopped. The directory is an ordinary export:
`import-prometheus --export DIR` reads it again and gives the same rows. The fetch lists the answer
files it writes (WRITTEN) and reuses, moves or removes those alone: whatever else is in the folder
stays as it is.

A server is trusted with nothing: each call, its retries included, has a deadline for its whole
answer (DEADLINE_S), the whole fetch has one too (FETCH_DEADLINE_S), each request reads at most
MAX_ANSWER_MIB of its answer, a redirect is followed on the URL's own origin only (the credentials go
nowhere else), every answer used is checked to have the shape the fetch reads (a
malformed one is an error in one line naming the call), and the server's text is cleaned of escape
sequences and credentials before it reaches a message (`Client.clean`).

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
import contextlib
import datetime as dt
import hashlib
import http.client
import json
import logging
import math
import os
import re
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TextIO

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
MAX_ANSWER_MIB = 128
"""The most bytes of one answer read, in MiB: an answer of PER_ANSWER samples is some 25 to 45 MiB,
and one parsed takes about seven times its size in memory."""
DEADLINE_S = 300.0
"""The most seconds one call may take, its answer read whole: every attempt and every wait between
them included."""
FETCH_DEADLINE_S = 3600.0
"""The most seconds the whole fetch may take, from when its client is made: however slowly the server
answers each call, the fetch ends by then (a rerun resumes it)."""


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


class _Refused(Exception):  # noqa: N818 (not an OSError or ValueError: never retried)
    """An answer no retry would mend: too big, nested too deeply, or a redirect to another origin."""


class Client:
    """GET/POST on a Prometheus's /api/v1, with retries. Every call ends within `deadline_s`, its
    attempts and the waits between them included, and every call of the client within
    `fetch_deadline_s` of its making (a server that trickles bytes is cut off, as one that says nothing
    is after `timeout_s`); each answer is read whole and at most `max_answer_bytes` of it; credentials
    go to the URL's origin alone (a redirect elsewhere is refused), and the server's text reaches a
    message cleaned (`Client.clean`)."""

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 60.0,
        deadline_s: float = DEADLINE_S,
        fetch_deadline_s: float = FETCH_DEADLINE_S,
        max_answer_bytes: int = MAX_ANSWER_MIB << 20,
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
        if not (deadline_s > 0 and fetch_deadline_s > 0 and max_answer_bytes > 0):
            raise ValueError(
                "deadlines and answer size must be positive, got "
                f"{deadline_s}, {fetch_deadline_s}, {max_answer_bytes}"
            )
        host = parts.hostname + (f":{parts.port}" if parts.port else "")
        host = f"[{host}]" if ":" in parts.hostname and not host.startswith("[") else host
        self.base = urllib.parse.urlunsplit((parts.scheme, host, parts.path.rstrip("/"), "", ""))
        self.shown = self.base  # credentials never appear in messages, logs or files
        self._headers = {"Accept": "application/json"}
        self._secrets: list[str] = []  # what `clean` removes from the server's text
        if (
            parts.username is not None
        ):  # basic auth from the URL, as curl and Prometheus's own clients take it
            user, password = urllib.parse.unquote(parts.username), urllib.parse.unquote(parts.password or "")
            pair = base64.b64encode(f"{user}:{password}".encode()).decode()
            self._headers["Authorization"] = f"Basic {pair}"
            self._secrets += [pair, parts.username, parts.password or "", user, password]
        if bearer_token:
            self._headers["Authorization"] = f"Bearer {bearer_token}"
            self._secrets.append(bearer_token)
        self._secrets = sorted({s for s in self._secrets if s}, key=len, reverse=True)
        self.timeout_s, self.attempts, self.backoff_s, self._sleep = timeout_s, attempts, backoff_s, sleep
        self.deadline_s, self.max_answer_bytes = deadline_s, max_answer_bytes
        self.fetch_deadline_s = fetch_deadline_s
        self._fetch_ends = time.monotonic() + fetch_deadline_s
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
        what = f"{path} {self.clean(params['query'], 120)!r}" if "query" in params else path
        ends = min(time.monotonic() + self.deadline_s, self._fetch_ends)
        last = ""
        for attempt in range(self.attempts):
            if attempt:
                self.retries += 1
                self._sleep(min(self.backoff_s * 2 ** (attempt - 1), max(0.0, ends - time.monotonic())))
            left = ends - time.monotonic()
            if left <= 0:  # no time for another attempt: the call's bound holds, retries and all
                tried = f" after {attempt} attempt{'s' * (attempt > 1)}; the last: {last}" if attempt else ""
                raise PrometheusError(f"{self.shown}: {what}: {self._late()}{tried}")
            try:
                answer = self._answer(request, left)
            except _Late:
                raise PrometheusError(f"{self.shown}: {what}: {self._late()}") from None
            except _HTTPRefusal as exc:
                error = self.clean(exc.text)
                if exc.code == 429 or exc.code >= 500:
                    last = f"HTTP {exc.code}: {error}"
                    continue
                raise PrometheusError(f"{self.shown}: {path} refused (HTTP {exc.code}): {error}") from None
            except _Refused as exc:
                raise PrometheusError(f"{self.shown}: {path}: {self.clean(str(exc))}") from None
            except (
                OSError,
                ValueError,
                http.client.HTTPException,
            ) as exc:  # URLError, timeouts, resets, a cut-off body
                last = self.clean(str(getattr(exc, "reason", exc)))
                continue
            if not isinstance(answer, dict) or answer.get("status") != "success":
                raise PrometheusError(f"{self.shown}: {path} answered {self.clean(_brief(answer))}")
            return answer.get("data")
        raise PrometheusError(
            f"{self.shown}: {what}: gave up after {self.attempts} attempts; the last: {last}"
        )

    def _late(self) -> str:
        """Why a call ran out of time: its own deadline, or the fetch's."""
        if time.monotonic() >= self._fetch_ends:
            return (
                f"the fetch did not finish within its {self.fetch_deadline_s:g} s deadline "
                "(--fetch-deadline); the same command resumes it"
            )
        return f"no whole answer within the {self.deadline_s:g} s deadline (--request-deadline)"

    def _answer(self, request: urllib.request.Request, seconds: float) -> Any:
        """One attempt: the answer parsed, read whole within `seconds` and the size cap; _Late when
        the watch cut it (whatever the cut looked like: an error, or a body that ended early)."""
        watch = _Watch(seconds)
        opener = urllib.request.build_opener(_SameOrigin(), _HTTPHandler(watch), _HTTPSHandler(watch))
        try:
            try:
                with opener.open(request, timeout=min(self.timeout_s, seconds)) as response:
                    body = _read_capped(response, self.max_answer_bytes)
            except urllib.error.HTTPError as exc:
                with exc:
                    raise _HTTPRefusal(exc.code, _error_of(exc)) from None
        except (OSError, ValueError, http.client.HTTPException, _HTTPRefusal) as exc:
            if watch.stop():
                raise _Late from exc
            raise
        finally:
            cut = watch.stop()
        if cut:  # a body with a Content-Length ends early, without an error, when cut
            raise _Late
        try:
            return json.loads(body)
        except RecursionError:
            raise _Refused("an answer nested too deeply to read") from None

    def clean(self, text: str, limit: int = 200) -> str:
        """The server's text made fit for a message: escape sequences and other control characters
        gone, credentials and whatever follows an Authorization/Bearer/Basic word redacted, and cut
        to `limit` characters (a server may echo the request's headers back)."""
        text = _ESCAPE.sub("", text)
        for secret in self._secrets:
            text = text.replace(secret, "[redacted]")
        text = _CREDENTIAL.sub(lambda m: f"{m.group(1)} [redacted]", text)
        text = " ".join("".join(c if c.isprintable() else " " for c in text).split())
        return text if len(text) <= limit else text[: limit - 3] + "..."


_ESCAPE = re.compile(
    r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-_]?)|\x9b[0-?]*[ -/]*[@-~]"
)
"""ANSI escape sequences (CSI, OSC, and the two-character ones), in their 7- and 8-bit forms."""
_CREDENTIAL = re.compile(
    r"(?i)\b(authorization|bearer|basic|token|password)\b[\"']?\s*[:=]?\s*[\"']?"
    r"(?:(?:bearer|basic)\s+)?[^\s,;\"'&}]*"
)


class _Late(Exception):  # noqa: N818
    """An attempt cut off by the watch at the call's (or the fetch's) deadline."""


class _HTTPRefusal(Exception):  # noqa: N818
    """An HTTP error status and the text the server gave with it."""

    def __init__(self, code: int, text: str) -> None:
        super().__init__(code, text)
        self.code, self.text = code, text


def _brief(answer: Any) -> str:
    """An answer that is not a success, in a few words: its text fields, never the repr of a
    structure (as deep or as long as the server likes)."""
    if not isinstance(answer, dict):
        return f"a JSON {type(answer).__name__}, not an object"
    return f"status {_text(answer.get('status'))[:40]!r}, error {_text(answer.get('error'))[:200]!r}"


def _text(value: Any) -> str:
    """A JSON value as text when it is text, else its type's name."""
    return value if isinstance(value, str) else f"<a JSON {type(value).__name__}>"


def _error_of(exc: urllib.error.HTTPError) -> str:
    """The `error` of an error answer (its first 64 KiB), else the status line's reason."""
    try:
        answer = json.loads(exc.read(_ERROR_BYTES))
    except (OSError, ValueError, RecursionError, http.client.HTTPException):
        answer = None
    if isinstance(answer, dict) and isinstance(answer.get("error"), str):
        return str(answer["error"])
    return exc.reason if isinstance(exc.reason, str) else f"HTTP {exc.code}"


_ERROR_BYTES = 64 << 10
_READ = 1 << 20


def _read_capped(response: http.client.HTTPResponse, cap: int) -> bytearray:
    """The body, refused once it passes `cap` bytes (declared or read): never held whole beyond it."""
    declared = response.headers.get("Content-Length", "")
    if declared.isdigit() and int(declared) > cap:
        raise _Refused(_too_big(cap, f"an answer of {int(declared) / 2**20:.0f} MiB is over"))
    body = bytearray()
    while chunk := response.read(_READ):
        body += chunk
        if len(body) > cap:
            raise _Refused(_too_big(cap, "an answer longer than"))
    return body


def _too_big(cap: int, what: str) -> str:
    return (
        f"{what} the {cap / 2**20:g} MiB limit (--max-answer-mib): raise it, or ask fewer points "
        "a query (--points)"
    )


class _Watch:
    """One request's deadline: when it passes, the request's sockets are shut, which ends a read
    blocked on a server that sends a byte now and then (a socket timeout counts each read alone)."""

    def __init__(self, seconds: float) -> None:
        self.expired = self._stopped = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def add(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)
            if self.expired:
                _shut(sock)

    def stop(self) -> bool:
        """Stop the watch; whether it had cut the request (never after this returns)."""
        self._timer.cancel()
        with self._lock:
            self._stopped = True
            return self.expired

    def _expire(self) -> None:
        with self._lock:
            if self._stopped:
                return
            self.expired = True
            for sock in self._sockets:
                _shut(sock)


def _shut(sock: socket.socket) -> None:
    # The plain socket's shutdown (a TLS one's would touch the TLS state another thread reads); one
    # closed already, or detached by the TLS wrap that replaced it, needs none.
    with contextlib.suppress(OSError):
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


class _Connection(http.client.HTTPConnection):
    """A connection whose socket the watch can shut."""

    def __init__(self, host: str, *, watch: _Watch, **kwargs: Any) -> None:
        super().__init__(host, **kwargs)
        self._watch = watch
        self._create_connection = self._watched

    def _watched(self, *args: Any, **kwargs: Any) -> socket.socket:
        sock = socket.create_connection(*args, **kwargs)
        self._watch.add(sock)
        return sock


class _TLSConnection(http.client.HTTPSConnection):
    """An https connection whose sockets the watch can shut: the plain one through the handshake,
    then the TLS one that replaces it."""

    def __init__(self, host: str, *, watch: _Watch, **kwargs: Any) -> None:
        super().__init__(host, **kwargs)
        self._watch = watch
        self._create_connection = self._watched

    def _watched(self, *args: Any, **kwargs: Any) -> socket.socket:
        sock = socket.create_connection(*args, **kwargs)
        self._watch.add(sock)
        return sock

    def connect(self) -> None:
        super().connect()
        self._watch.add(self.sock)


class _HTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, watch: _Watch) -> None:
        super().__init__()
        self._watch = watch

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(self._connection, req)

    def _connection(self, host: str, /, **kwargs: Any) -> http.client.HTTPConnection:
        return _Connection(host, watch=self._watch, **kwargs)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, watch: _Watch) -> None:
        super().__init__()
        self._watch = watch

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(self._connection, req)

    def _connection(self, host: str, /, **kwargs: Any) -> http.client.HTTPConnection:
        return _TLSConnection(host, watch=self._watch, **kwargs)


class _SameOrigin(urllib.request.HTTPRedirectHandler):
    """Follows a redirect on the same origin (scheme, host, port) only: the request's Authorization
    header would go wherever the redirect points, so a redirect elsewhere is refused."""

    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: IO[bytes],
        code: int,
        msg: str,
        headers: http.client.HTTPMessage,
        newurl: str,
    ) -> urllib.request.Request | None:
        if _origin(newurl) != _origin(req.full_url):
            there = urllib.parse.urlsplit(newurl)
            shown = f"{there.scheme}://{there.hostname or ''}" + (f":{there.port}" if there.port else "")
            raise _Refused(
                f"redirected (HTTP {code}) to another server, {shown}: not followed, so that the "
                "credentials go nowhere else; give that server as --url if it is the one"
            )
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urllib.parse.urlsplit(url)
    try:
        port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    except ValueError:  # a port that is no number: an origin of its own
        port = -1
    return parts.scheme.lower(), (parts.hostname or "").lower(), port


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
    listed = _list(client, "label/__name__/values", client.call("label/__name__/values", window))
    names = sorted(name for name in listed if isinstance(name, str) and known(name))
    if not names:
        shown = client.clean(", ".join(str(n)[:80] for n in listed[:8])) or "none"
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
    own = _own(folder)
    kept = {
        m.group(2): folder / name for name in own if (m := _ANSWER.match(name)) and (folder / name).is_file()
    }
    with (folder / WRITTEN).open("a", encoding="utf-8") as written:
        for q, query in enumerate(queries):
            most = min(points, max(1, per_answer // max(1, width[query.reads])))
            for a, b in _chunks(start, end, step_s, most):
                digest = hashlib.sha256(f"{query.expr}|{a}|{b}|{step_s}".encode()).hexdigest()[:12]
                target = folder / f"{q:03d}-{round(a):011d}-{digest}.json"  # file order: query, then time
                wanted.add(target.name)
                if digest in kept:
                    if kept[digest] != target:
                        _mine(target, own, written)
                        kept[digest].replace(target)  # the same answer, the query at another place
                    report.answers_reused += 1
                    continue
                result = _range(client, query.expr, a, b, step_s, report)
                for series in result:
                    labels = series["metric"]
                    labels["__name__"] = query.name
                    if query.stat is not None:
                        labels[STEP_LABEL] = query.stat
                report.series += len(result)
                _mine(target, own, written)
                _write_answer(target, result)
                report.answers_fetched += 1
    for name in sorted(own - wanted):  # its answers of another window, and any cut short
        (folder / name).unlink(missing_ok=True)
        (folder / name).with_suffix(".partial").unlink(missing_ok=True)
    _note_written(folder, wanted)
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
WRITTEN = "fetched.txt"
"""The fetch folder's list of the answer files the fetch wrote (or began to), one name a line: the
files it may reuse, replace or remove. Whatever else the folder holds is never touched."""


def _own(folder: Path) -> set[str]:
    """The answer files this folder's fetch wrote."""
    listed = folder / WRITTEN
    if listed.exists():
        return {name for name in listed.read_text(encoding="utf-8").splitlines() if _ANSWER.match(name)}
    # A fetch folder from before the list was kept: its answers are those of the fetch it notes.
    return {path.name for path in folder.iterdir() if _ANSWER.match(path.name)}


def _mine(target: Path, own: set[str], written: TextIO) -> None:
    """Note `target` as the fetch's before it is written (so that a fetch cut short can remove it);
    DataError when a file the fetch did not write has its name."""
    if target.name in own:
        return
    if target.exists() or target.with_suffix(".partial").exists():
        raise DataError(
            f"--fetch-dir {target.parent}: {target.name} is not a file this fetch wrote: "
            "move it away or give another --fetch-dir"
        )
    written.write(target.name + "\n")
    written.flush()
    own.add(target.name)


def _note_written(folder: Path, names: set[str]) -> None:
    """The list of the fetch's files, now those of this window alone."""
    fresh = folder / (WRITTEN + ".new")
    fresh.write_text("".join(f"{name}\n" for name in sorted(names)), encoding="utf-8")
    fresh.replace(folder / WRITTEN)


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
    if not note.exists():
        (folder / WRITTEN).touch()  # a new fetch: nothing in the folder is its own yet
    note.write_text(about)


def _series_count(client: Client, name: str, window: dict[str, str]) -> int:
    """How many series of this name the window holds (from the index: no samples are read)."""
    return len(_list(client, f"series of {name}", client.call("series", {"match[]": name, **window})))


def _list(client: Client, what: str, data: Any) -> list[Any]:
    if data is None:
        return []
    if not isinstance(data, list):
        raise PrometheusError(f"{client.shown}: {what}: answered a JSON {type(data).__name__}, not a list")
    return data


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
        most = max((float(v) for s in result for _, v in s["values"]), default=0.0)
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
    return _matrix(client, expr, data)


def _matrix(client: Client, expr: str, data: Any) -> list[dict[str, Any]]:
    """The series of a range query's `data`, each checked to be what the fetch writes and the import
    reads (labels of text, [time, "number"] pairs): PrometheusError naming the query otherwise."""

    def wrong(what: str) -> PrometheusError:
        return PrometheusError(f"{client.shown}: {expr!r} answered {what}, not a range query's matrix")

    if not isinstance(data, dict) or data.get("resultType") != "matrix":
        kind = _text(data.get("resultType")) if isinstance(data, dict) else f"a JSON {type(data).__name__}"
        raise wrong(client.clean(kind[:40]))
    result = data.get("result")
    if not isinstance(result, list):
        raise wrong(f"a result that is a JSON {type(result).__name__}")
    for k, series in enumerate(result):
        if not isinstance(series, dict):
            raise wrong(f"a series (#{k}) that is a JSON {type(series).__name__}")
        labels = series.setdefault("metric", {})
        if not (isinstance(labels, dict) and all(isinstance(v, str) for v in labels.values())):
            raise wrong(f"labels of series #{k} that are not names to text")
        values = series.setdefault("values", [])  # none: a series of native histograms alone
        if not isinstance(values, list) or not all(_sample(pair) for pair in values):
            raise wrong(f'values of series #{k} that are not [time, "number"] pairs')
    return result


def _sample(pair: Any) -> bool:
    """Whether a range query's value is [finite time, number as text] (NaN and Inf as Prometheus writes them)."""
    if not (type(pair) is list and len(pair) == 2 and type(pair[1]) is str):
        return False
    t = pair[0]
    if not (type(t) in (int, float) and math.isfinite(t)):
        return False
    try:
        float(pair[1])
    except ValueError:
        return False
    return True


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
