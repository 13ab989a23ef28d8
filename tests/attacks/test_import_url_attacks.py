"""`faultcast import-prometheus --url` against a server that lies, hangs or breaks, as the probe ran it
over loopback: a redirect to another port received the credentials, an endless answer grew the import
to a MemoryError, a byte every few seconds held it for ever, malformed answers ended in tracebacks, a
rerun removed files the fetch had not written, and the server's error text reached the terminal raw.
Each server here is an http.server on 127.0.0.1 port 0, in a thread."""

from __future__ import annotations

import base64
import http.server
import json
import re
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from faultcast.cli.app import main
from faultcast.model.features.offline import DataError
from faultcast.model.importers.fetch import Client, PrometheusError
from faultcast.model.importers.prometheus import fetch_prometheus
from tests.pki import Authority

NAME = "DCGM_FI_DEV_GPU_TEMP"
STEP = 60.0
SINCE, UNTIL = 600_000.0, 600_000.0 + 6 * STEP  # seven evaluation times
TOKEN = "tok-7f3a9c1e55"  # noqa: S105 (a test credential)
PASSWORD = "s3cret-pw"  # noqa: S105
PAIR = base64.b64encode(f"alice:{PASSWORD}".encode()).decode()


class _Server(http.server.ThreadingHTTPServer):
    """Answers each request with `reply(handler)`, keeping what each request's headers were."""

    def __init__(self, reply: Callable[[_Handler], None]) -> None:
        self.reply = reply
        self.seen: list[tuple[str, dict[str, str]]] = []  # (path, headers)
        self.sent = 0  # bytes of the answers written (by the replies that count them)
        super().__init__(("127.0.0.1", 0), _Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        self.server.seen.append((self.path, dict(self.headers)))
        self.server.reply(self)

    def do_POST(self) -> None:
        self.form = urllib.parse.parse_qs(
            self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
        )
        self.do_GET()

    def send(self, status: int, body: bytes, **headers: str) -> None:
        self.send_response(status)
        for key, value in {"Content-Length": str(len(body)), **headers}.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@contextmanager
def serving(reply: Callable[[_Handler], None]) -> Iterator[_Server]:
    server = _Server(reply)
    thread = threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def _success(data: Any) -> bytes:
    return json.dumps({"status": "success", "data": data}).encode()


def prometheus(handler: _Handler, *, values: Callable[[float], Any] = lambda t: "50") -> None:
    """A Prometheus holding one GPU's temperature, scraped once a step."""
    path = handler.path.split("?")[0]
    if path.endswith("/label/__name__/values"):
        handler.send(200, _success([NAME, "up"]))
    elif path.endswith("/series"):
        handler.send(200, _success([{"__name__": NAME, "gpu": "0", "Hostname": "n1"}]))
    elif path.endswith("/query_range"):
        form = handler.form
        start, end, step = (float(form[k][0]) for k in ("start", "end", "step"))
        times = [start + k * step for k in range(round((end - start) / step) + 1)]
        probe = form["query"][0].startswith("max(")  # the scrape-interval probe: one scrape a step
        result = [{"metric": {} if probe else {"gpu": "0", "Hostname": "n1"},
                   "values": [[t, "1" if probe else values(t)] for t in times]}]  # fmt: skip
        handler.send(200, _success({"resultType": "matrix", "result": result}))
    else:
        handler.send(404, b"{}")


def _import(url: str, out: Path, *extra: str) -> list[str]:
    return ["import-prometheus", "--url", url, "--since", str(SINCE), "--until", str(UNTIL), "--step", "60s",
            "--attempts", "1", "--out", str(out), *extra]  # fmt: skip


def _one_line(capsys: pytest.CaptureFixture[str], code: int) -> str:
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1, err
    assert err.startswith("faultcast import-prometheus: "), err
    return err


# -- 9: credentials go to the URL's origin alone ----------------------------------------------------------


@pytest.mark.parametrize("how", ["basic", "bearer"])
def test_a_redirect_to_another_origin_gets_no_credentials(how: str, tmp_path: Path) -> None:
    with serving(lambda h: h.send(200, _success([]))) as elsewhere:

        def redirect(handler: _Handler) -> None:
            handler.send(302, b"", Location=f"{elsewhere.url}/api/v1/label/__name__/values")

        with serving(redirect) as server:
            url = server.url.replace("//", f"//alice:{PASSWORD}@") if how == "basic" else server.url
            client = Client(url, attempts=1, bearer_token=TOKEN if how == "bearer" else None)
            with pytest.raises(
                PrometheusError, match=r"redirected \(HTTP 302\) to another server"
            ) as refused:
                client.call("label/__name__/values", {})
            assert server.seen[0][1]["Authorization"]  # the server named was sent them
    assert elsewhere.seen == []  # the other was not even asked
    assert "\n" not in str(refused.value)


def test_a_redirect_on_the_same_origin_is_followed_with_the_credentials() -> None:
    def reply(handler: _Handler) -> None:
        if handler.path.startswith("/old/"):
            handler.send(302, b"", Location=handler.path.replace("/old/", "/new/"))
        else:
            handler.send(200, _success(["up"]))

    with serving(reply) as server:
        client = Client(f"{server.url}/old", attempts=1, bearer_token=TOKEN)
        assert client.call("label/__name__/values", {}) == ["up"]
    assert [(path.split("?")[0], headers["Authorization"]) for path, headers in server.seen] == [
        ("/old/api/v1/label/__name__/values", f"Bearer {TOKEN}"),
        ("/new/api/v1/label/__name__/values", f"Bearer {TOKEN}"),
    ]


# -- 10: an answer is read up to a limit ------------------------------------------------------------------

ENDLESS = 64 << 20  # what the "endless" answer sends at most, so that the old code ended too


def _endless(handler: _Handler) -> None:
    """A chunked answer that goes on (to ENDLESS bytes), never valid JSON."""
    handler.send_response(200)
    handler.send_header("Transfer-Encoding", "chunked")
    handler.end_headers()
    chunk = b"[" * (256 << 10)
    try:
        while handler.server.sent < ENDLESS:
            handler.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            handler.server.sent += len(chunk)
        handler.wfile.write(b"0\r\n\r\n")
    except OSError:
        pass  # the client hung up


def test_an_endless_answer_is_cut_at_the_limit() -> None:
    with serving(_endless) as server:
        client = Client(server.url, attempts=3, max_answer_bytes=1 << 20, sleep=lambda s: None)
        with pytest.raises(
            PrometheusError, match=r"an answer longer than the 1 MiB limit \(--max-answer-mib\)"
        ):
            client.call("label/__name__/values", {})
    assert len(server.seen) == 1  # not retried: the same query would get the same answer
    # What the server got written before the client hung up: the limit and the sockets' buffers.
    assert server.sent < ENDLESS // 4, server.sent


def test_an_answer_declared_over_the_limit_is_not_read() -> None:
    def huge(handler: _Handler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Length", str(10 << 30))
        handler.end_headers()

    with serving(huge) as server:
        client = Client(server.url, attempts=1, max_answer_bytes=1 << 20)
        with pytest.raises(PrometheusError, match="an answer of 10240 MiB is over the 1 MiB limit"):
            client.call("label/__name__/values", {})


# -- 11: a deadline on each call, its retries included, and on the whole fetch ------------------------------


def _trickle(handler: _Handler) -> None:
    """A byte of a valid-looking answer now and then, for ever (until the client hangs up)."""
    handler.send_response(200)
    handler.send_header("Transfer-Encoding", "chunked")
    handler.end_headers()
    try:
        handler.wfile.write(b"1\r\n[\r\n")
        for _ in range(2000):  # a minute at most: the test must end against the old code too
            time.sleep(0.03)  # the attack itself: a byte at a time, each well inside the read timeout
            handler.wfile.write(b"2\r\n1,\r\n")
            handler.wfile.flush()
    except OSError:
        pass


def _trickle_declared(handler: _Handler) -> None:
    """The same, with a Content-Length: a body cut short then ends without an error."""
    handler.send_response(200)
    handler.send_header("Content-Length", "100000")
    handler.end_headers()
    try:
        for _ in range(2000):
            time.sleep(0.03)
            handler.wfile.write(b" ")
            handler.wfile.flush()
    except OSError:
        pass


@pytest.mark.parametrize("reply", [_trickle, _trickle_declared], ids=["chunked", "content-length"])
def test_a_server_sending_a_byte_now_and_then_is_cut_off_at_the_deadline(
    reply: Callable[[_Handler], None],
) -> None:
    with serving(reply) as server:
        waits: list[float] = []
        client = Client(server.url, attempts=5, timeout_s=30, deadline_s=0.2, sleep=waits.append)
        with pytest.raises(PrometheusError) as cut:
            client.call("query", {"query": "up"})
    # The deadline bounds the call, not each attempt: no time is left for a retry.
    assert (len(server.seen), waits) == (1, [])
    assert str(cut.value) == (
        f"{server.url}: query 'up': no whole answer within the 0.2 s deadline (--request-deadline)"
    )


def test_a_retry_gets_what_is_left_of_the_calls_deadline() -> None:
    def busy_then_trickle(handler: _Handler) -> None:
        if len(handler.server.seen) == 1:
            handler.send(503, b'{"status":"error","error":"busy"}')
        else:
            _trickle(handler)

    with serving(busy_then_trickle) as server:
        waits: list[float] = []
        client = Client(server.url, attempts=3, deadline_s=0.5, backoff_s=10, sleep=waits.append)
        with pytest.raises(PrometheusError, match=r"^\S+: query 'up': no whole answer within the 0\.5 s "
                           r"deadline \(--request-deadline\)"):  # fmt: skip
            client.call("query", {"query": "up"})
    # The 503 was retried after a wait cut from 10 s to what the call had left; the trickle took the rest.
    assert len(waits) == 1, waits
    assert waits[0] <= 0.5, waits


def test_the_whole_fetch_ends_at_its_deadline(tmp_path: Path) -> None:
    def trickled_queries(handler: _Handler) -> None:
        if handler.path.endswith("/query_range") and handler.form["query"][0].startswith("last_over_time("):
            _trickle_declared(handler)
        else:
            prometheus(handler)

    with serving(trickled_queries) as server:
        client = Client(server.url, attempts=5, deadline_s=60, fetch_deadline_s=0.5, sleep=lambda s: None)
        with pytest.raises(PrometheusError) as cut:
            fetch_prometheus(server.url, SINCE, UNTIL, STEP, tmp_path / "fetch", client=client)
    # The call cut is the trickled query but for a machine so loaded that the calls before it took 0.5 s.
    called = r"(query_range 'last_over_time\(DCGM_FI_DEV_GPU_TEMP\[59999ms\]\)'|[a-z_/]+)"
    assert re.fullmatch(
        rf"{server.url}: {called}: the fetch did not finish within its 0\.5 s deadline "
        r"\(--fetch-deadline\); the same command resumes it",
        str(cut.value),
    ), cut.value
    assert client.retries == 0  # the call was cut once, not tried again


def test_over_https_too_the_answer_is_read_and_a_trickle_cut_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pki = Authority(tmp_path / "pki", "prometheus")
    pair = pki.server()
    monkeypatch.setenv("SSL_CERT_FILE", str(pki.ca.cert))  # the default context trusts the test CA
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(pair.cert, pair.key)
    for reply in (lambda h: h.send(200, _success(["up"])), _trickle):
        with serving(reply) as server:
            server.socket = tls.wrap_socket(server.socket, server_side=True)
            client = Client(
                server.url.replace("http:", "https:"), attempts=1, deadline_s=0.2, bearer_token=TOKEN
            )
            if reply is _trickle:
                with pytest.raises(PrometheusError, match=r"no whole answer within the 0\.2 s deadline"):
                    client.call("label/__name__/values", {})
            else:
                assert client.call("label/__name__/values", {}) == ["up"]
                assert server.seen[0][1]["Authorization"] == f"Bearer {TOKEN}"


def test_the_limits_are_flags_and_their_refusals_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with serving(_endless) as server:
        err = _one_line(capsys, main(_import(server.url, tmp_path / "a", "--max-answer-mib", "1")))
    assert "an answer longer than the 1 MiB limit (--max-answer-mib)" in err
    with serving(_trickle) as server:
        err = _one_line(capsys, main(_import(server.url, tmp_path / "b", "--request-deadline", "300ms")))
    assert "label/__name__/values: no whole answer within the 0.3 s deadline (--request-deadline)" in err
    with serving(_trickle_declared) as server:
        err = _one_line(capsys, main(_import(server.url, tmp_path / "d", "--fetch-deadline", "300ms")))
    assert "the fetch did not finish within its 0.3 s deadline (--fetch-deadline)" in err
    err = _one_line(capsys, main(_import("http://127.0.0.1:9", tmp_path / "c", "--max-answer-mib", "0")))
    assert "--max-answer-mib at least 1" in err


# -- 12: malformed answers are one line naming the query ---------------------------------------------------


def _with(**answers: bytes) -> Callable[[_Handler], None]:
    """`prometheus`, but the calls whose path ends with a key answered with its bytes instead."""

    def reply(handler: _Handler) -> None:
        path = handler.path.split("?")[0]
        for ending, body in answers.items():
            if path.endswith(ending):
                if "query" in ending and not handler.form["query"][0].startswith("last_over_time("):
                    break  # only the answers' queries, not the probe
                handler.send(200, body)
                return
        prometheus(handler)

    return reply


def _range_answer(result: Any) -> bytes:
    return _success({"resultType": "matrix", "result": result})


MALFORMED = {
    "nested": (_with(values=b"[" * 100_000 + b"]" * 100_000), "label/__name__/values: an answer nested too deeply"),
    "names not a list": (_with(values=_success(5)), "label/__name__/values: answered a JSON int, not a list"),
    "series not a list": (_with(series=_success({"a": 1})), "series of DCGM_FI_DEV_GPU_TEMP: answered a JSON dict"),
    "not an object": (_with(values=b"[1, 2]"), "label/__name__/values answered a JSON list, not an object"),
    "result not a list": (_with(query_range=_success({"resultType": "matrix", "result": 7})),
                          "answered a result that is a JSON int"),
    "series not an object": (_with(query_range=_range_answer(["x"])), "answered a series (#0) that is a JSON str"),
    "labels not text": (_with(query_range=_range_answer([{"metric": {"gpu": 0}, "values": []}])),
                        "answered labels of series #0 that are not names to text"),
    "a value abc": (_with(query_range=_range_answer([{"metric": {}, "values": [[600000, "abc"]]}])),
                    'answered values of series #0 that are not [time, "number"] pairs'),
    "values a string": (_with(query_range=_range_answer([{"metric": {}, "values": "abc"}])),
                        "answered values of series #0 that are not"),
    "a time of text": (_with(query_range=_range_answer([{"metric": {}, "values": [["600000", "1"]]}])),
                       "answered values of series #0 that are not"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(MALFORMED))
def test_a_malformed_answer_is_one_line_naming_the_call(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    reply, message = MALFORMED[case]
    with serving(reply) as server:
        err = _one_line(capsys, main(_import(server.url, tmp_path / "out")))
    assert message in err, err
    if "#0" in message or "a result" in message:
        assert "last_over_time(DCGM_FI_DEV_GPU_TEMP[59999ms])" in err  # the query is named


def test_a_probe_answering_a_value_abc_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def reply(handler: _Handler) -> None:
        if handler.path.endswith("/query_range") and handler.form["query"][0].startswith("max("):
            handler.send(200, _range_answer([{"metric": {}, "values": [[600000, "abc"]]}]))
        else:
            prometheus(handler)

    with serving(reply) as server:
        err = _one_line(capsys, main(_import(server.url, tmp_path / "out")))
    assert "'max(count_over_time(DCGM_FI_DEV_GPU_TEMP[59999ms]))' answered values of series #0" in err


# -- 13: the fetch folder's other files are left alone -----------------------------------------------------


def test_a_rerun_removes_only_what_the_fetch_wrote(tmp_path: Path) -> None:
    folder = tmp_path / "fetch"
    with serving(prometheus) as server:
        first = fetch_prometheus(server.url, SINCE, UNTIL, STEP, folder, points=3)
        assert first.answers_fetched == 3
        mine = sorted(p.name for p in folder.glob("0*.json"))
        theirs = {"notes.partial": "mine", "123-00000000000-0123456789ab.json": "{}", "x.json.partial": "."}
        for name, text in theirs.items():
            (folder / name).write_text(text)
        (folder / mine[-1]).with_suffix(".partial").write_text("cut short")  # the fetch's own, cut short
        # Spans on a grid of 3 steps from the epoch: [10000, 10001] [10002, 10004] [10005, 10006], then
        # ... [10005, 10007] [10008, 10009]: the first two are reused, the third is another span's.
        moved = fetch_prometheus(server.url, SINCE, UNTIL + 3 * STEP, STEP, folder, points=3)
    assert moved.answers_reused == 2
    for name, text in theirs.items():
        assert (folder / name).read_text() == text
    assert not (folder / mine[-1]).exists()  # the fetch's own answer of the first window's last span
    assert not (folder / mine[-1]).with_suffix(".partial").exists()
    assert len(list(folder.glob("0*.json"))) == moved.answers_fetched + moved.answers_reused


def test_a_fetch_folder_from_before_the_list_keeps_its_answers(tmp_path: Path) -> None:
    folder = tmp_path / "fetch"
    with serving(prometheus) as server:
        fetch_prometheus(server.url, SINCE, UNTIL, STEP, folder, points=3)
        (folder / "fetched.txt").unlink()  # as an older faultcast left it: its answers are the fetch's
        again = fetch_prometheus(server.url, SINCE, UNTIL, STEP, folder, points=3)
    assert again.answers_reused == 3
    assert again.answers_fetched == 0
    assert (folder / "fetched.txt").read_text().splitlines() == sorted(p.name for p in folder.glob("0*.json"))


def test_a_file_with_the_name_of_an_answer_to_write_is_not_overwritten(tmp_path: Path) -> None:
    folder = tmp_path / "fetch"
    with serving(prometheus) as server:
        fetch_prometheus(server.url, SINCE, UNTIL, STEP, folder, points=3)
        first = sorted(folder.glob("0*.json"))
        for path in first:
            path.unlink()
        (folder / "fetched.txt").write_text("")  # the fetch's list lost: the files are someone else's
        first[0].write_text("someone's")
        with pytest.raises(DataError, match=f"{first[0].name} is not a file this fetch wrote"):
            fetch_prometheus(server.url, SINCE, UNTIL, STEP, folder, points=3)
    assert first[0].read_text() == "someone's"


# -- 14: the server's text is cleaned before it is shown ---------------------------------------------------


def _echo(status: int) -> Callable[[_Handler], None]:
    """An error that echoes the request's Authorization header, in red, with a terminal title."""

    def reply(handler: _Handler) -> None:
        said = f"\x1b[31mbad request\x1b]0;pwned\x07 from {handler.headers['Authorization']} \r\n\x9b2J{'x' * 5000}"
        handler.send(status, json.dumps({"status": "error", "error": said}).encode())

    return reply


@pytest.mark.parametrize("status", [400, 503])
@pytest.mark.parametrize("how", ["basic", "bearer"])
def test_the_servers_error_text_is_cleaned(
    status: int, how: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with serving(_echo(status)) as server:
        url = server.url.replace("//", f"//alice:{PASSWORD}@") if how == "basic" else server.url
        extra = []
        if how == "bearer":
            (tmp_path / "token").write_text(TOKEN)
            extra = ["--bearer-token-file", str(tmp_path / "token")]
        err = _one_line(capsys, main(_import(url, tmp_path / "out", *extra)))
    assert "bad request" in err
    for secret in (PASSWORD, PAIR, TOKEN, "alice", "\x1b", "\x9b", "\x07", "\r", "pwned\x07"):
        assert secret not in err, (secret, err)
    assert "Authorization" not in err or "[redacted]" in err
    assert len(err) < 400


def test_a_status_line_of_escapes_is_cleaned(capsys: pytest.CaptureFixture[str]) -> None:
    def garbage(handler: _Handler) -> None:
        handler.wfile.write(b"\x1b[2J\x1b]0;owned\x07 HTTP/9 " + TOKEN.encode() + b"\r\n\r\n")

    with serving(garbage) as server:
        client = Client(server.url, attempts=1, bearer_token=TOKEN)
        with pytest.raises(PrometheusError) as refused:
            client.call("label/__name__/values", {})
    text = str(refused.value)
    for unwanted in ("\x1b", "\x07", TOKEN):
        assert unwanted not in text, text
