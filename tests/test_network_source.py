"""NetworkSource against fixture trees and this machine's /proc; PeerProber against real sockets."""

from __future__ import annotations

import math
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from faultcast.catalogue import Scope, metrics_for
from faultcast.collector.network import NetworkSource
from faultcast.collector.probes import DEFAULT_PEER_PORT, PeerProber, parse_peer, peer_id
from faultcast.collector.source import Source
from faultcast.readings import DeviceReading, Reading
from faultcast.testing.system import missing_part

# -- fixture trees --------------------------------------------------------------------------

FIXTURES = Path(__file__).parent / "fixtures" / "network"
# Copied from a real node, with counters edited: lo, eth0, ib0; Ip, Tcp and Udp line pairs.
NET_DEV = (FIXTURES / "proc" / "net" / "dev").read_text()
NET_SNMP = (FIXTURES / "proc" / "net" / "snmp").read_text()

MLX5_0_COUNTERS = {
    "symbol_error": 11,
    "link_downed": 2,
    "link_error_recovery": 5,
    "port_rcv_errors": 7,
    "port_xmit_discards": 13,
    "local_link_integrity_errors": 1,
    "excessive_buffer_overrun_errors": 0,
    "port_rcv_data": 1_000_000_000_000,
    "port_xmit_data": 250_000,
}
MLX5_0_HW = {"rnr_nak_retry_err": 3, "local_ack_timeout_err": 17, "out_of_sequence": 29, "packet_seq_err": 4}


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def make_proc(root: Path, net_dev: str = NET_DEV, snmp: str = NET_SNMP) -> Path:
    _write(root / "net" / "dev", net_dev)
    _write(root / "net" / "snmp", snmp)
    return root


def make_port(
    root: Path,
    dev: str,
    port: int,
    counters: dict[str, int | str],
    *,
    hw: dict[str, int] | None = None,
    state: str = "4: ACTIVE",
    phys_state: str = "5: LinkUp",
    rate: str = "400 Gb/sec (4X NDR)",
) -> Path:
    port_dir = root / "class" / "infiniband" / dev / "ports" / str(port)
    for name, value in counters.items():
        _write(port_dir / "counters" / name, f"{value}\n")
    for name, value in (hw or {}).items():
        _write(port_dir / "hw_counters" / name, f"{value}\n")
    _write(port_dir / "state", f"{state}\n")
    _write(port_dir / "phys_state", f"{phys_state}\n")
    _write(port_dir / "rate", f"{rate}\n")
    return port_dir


def make_sys(root: Path) -> Path:
    """mlx5_0 port 1 healthy with hw_counters; mlx5_1 port 1 down, no hw_counters, one "N/A" counter."""
    make_port(root, "mlx5_0", 1, dict(MLX5_0_COUNTERS), hw=MLX5_0_HW)
    broken: dict[str, int | str] = {name: 0 for name in MLX5_0_COUNTERS}
    broken["symbol_error"] = "N/A"
    make_port(root, "mlx5_1", 1, broken, state="1: DOWN", phys_state="3: Disabled", rate="10 Gb/sec (4X SDR)")
    return root


def by_device(reading: Reading, scope: Scope) -> dict[str, DeviceReading]:
    return {d.device: d for d in reading.devices if d.scope is scope}


def host_value(reading: Reading, name: str) -> float:
    assert reading.host is not None
    return reading.host[[m.name for m in metrics_for(Scope.HOST)].index(name)]


@pytest.fixture
def fixture_source(tmp_path: Path) -> Iterator[NetworkSource]:
    source = NetworkSource(make_proc(tmp_path / "proc"), make_sys(tmp_path / "sys"))
    yield source
    source.close()


# -- NetworkSource on fixture trees ---------------------------------------------------------


def test_is_a_source(fixture_source: NetworkSource) -> None:
    source: Source = fixture_source
    assert source.name == "network"


def test_interfaces_parsed_and_lo_left_out_by_default(fixture_source: NetworkSource) -> None:
    interfaces = by_device(fixture_source.read(), Scope.INTERFACE)
    assert sorted(interfaces) == ["eth0", "ib0"]
    eth0 = interfaces["eth0"]
    assert eth0.get("net_rx_bytes") == 9876543210
    assert eth0.get("net_rx_packets") == 7654321
    assert eth0.get("net_rx_errors") == 3
    assert eth0.get("net_rx_dropped") == 7
    assert eth0.get("net_tx_bytes") == 1234567890
    assert eth0.get("net_tx_packets") == 2345678
    assert eth0.get("net_tx_errors") == 1
    assert eth0.get("net_tx_dropped") == 2
    assert interfaces["ib0"].get("net_rx_dropped") == 11
    assert interfaces["ib0"].get("net_tx_errors") == 5


def test_named_interfaces_include_lo_and_report_missing_as_nan(tmp_path: Path) -> None:
    source = NetworkSource(make_proc(tmp_path / "proc"), tmp_path / "sys", interfaces=["lo", "eth9"])
    interfaces = by_device(source.read(), Scope.INTERFACE)
    assert sorted(interfaces) == ["eth9", "lo"]
    assert interfaces["lo"].get("net_rx_bytes") == 104857
    assert all(math.isnan(v) for v in interfaces["eth9"].values)


def test_host_tcp_counters(fixture_source: NetworkSource) -> None:
    reading = fixture_source.read()
    assert host_value(reading, "tcp_retrans_segs") == 42
    assert host_value(reading, "tcp_out_segs") == 1725
    assert host_value(reading, "tcp_in_errs") == 3


def test_infiniband_port_with_hw_counters(fixture_source: NetworkSource) -> None:
    port = by_device(fixture_source.read(), Scope.IB_PORT)["mlx5_0:1"]
    for name in (
        "symbol_error",
        "link_downed",
        "link_error_recovery",
        "port_rcv_errors",
        "port_xmit_discards",
    ):
        assert port.get(f"ib_{name}") == MLX5_0_COUNTERS[name]
    assert port.get("ib_local_link_integrity_errors") == 1
    assert port.get("ib_excessive_buffer_overrun_errors") == 0
    assert port.get("ib_port_rcv_data") == 4 * MLX5_0_COUNTERS["port_rcv_data"]
    assert port.get("ib_port_xmit_data") == 4 * MLX5_0_COUNTERS["port_xmit_data"]
    for name, value in MLX5_0_HW.items():
        assert port.get(f"ib_{name}") == value
    assert port.get("ib_port_state") == 4
    assert port.get("ib_port_phys_state") == 5
    assert port.get("ib_port_rate_gbps") == 400


def test_infiniband_port_down_without_hw_counters_and_na_counter(fixture_source: NetworkSource) -> None:
    reading = fixture_source.read()
    assert sorted(by_device(reading, Scope.IB_PORT)) == ["mlx5_0:1", "mlx5_1:1"]
    port = by_device(reading, Scope.IB_PORT)["mlx5_1:1"]
    assert math.isnan(port.get("ib_symbol_error"))  # "N/A"
    assert port.get("ib_link_downed") == 0
    for name in MLX5_0_HW:
        assert math.isnan(port.get(f"ib_{name}"))
    assert port.get("ib_port_state") == 1
    assert port.get("ib_port_phys_state") == 3
    assert port.get("ib_port_rate_gbps") == 10
    # Only the "N/A" file is an error: absent hw_counters are normal.
    assert fixture_source.read_errors == 1
    assert list(fixture_source.last_errors) == [str(port_path(fixture_source, "mlx5_1", "symbol_error"))]
    fixture_source.read()
    assert fixture_source.read_errors == 2


def port_path(source: NetworkSource, dev: str, counter: str) -> Path:
    return source.sys_root / "class" / "infiniband" / dev / "ports" / "1" / "counters" / counter


def test_unreadable_counter_file_is_nan_and_the_rest_is_read(tmp_path: Path) -> None:
    sys_root = make_sys(tmp_path / "sys")
    bad = port_path(NetworkSource(sys_root=sys_root), "mlx5_0", "link_downed")
    bad.unlink()
    bad.mkdir()  # reading a directory fails with an OSError, like EINVAL from a driver
    source = NetworkSource(make_proc(tmp_path / "proc"), sys_root)
    port = by_device(source.read(), Scope.IB_PORT)["mlx5_0:1"]
    assert math.isnan(port.get("ib_link_downed"))
    assert port.get("ib_symbol_error") == MLX5_0_COUNTERS["symbol_error"]
    assert port.get("ib_port_state") == 4
    assert str(bad) in source.last_errors
    assert source.read_errors == 2  # that file and mlx5_1's "N/A"


def test_vanished_port_is_dropped_without_errors(tmp_path: Path) -> None:
    # A port listed but gone by the time its files are read: sysfs ports are symlink-like
    # entries, so a dangling symlink reads exactly like a port removed mid-read.
    sys_root = make_sys(tmp_path / "sys")
    ports = sys_root / "class" / "infiniband" / "mlx5_0" / "ports"
    (ports / "2").symlink_to(tmp_path / "gone")
    source = NetworkSource(make_proc(tmp_path / "proc"), sys_root)
    assert sorted(by_device(source.read(), Scope.IB_PORT)) == ["mlx5_0:1", "mlx5_1:1"]
    assert source.read_errors == 1  # only mlx5_1's "N/A"


def test_missing_infiniband_class_means_no_ports(tmp_path: Path) -> None:
    source = NetworkSource(make_proc(tmp_path / "proc"), tmp_path / "empty-sys")
    reading = source.read()
    assert by_device(reading, Scope.IB_PORT) == {}
    assert sorted(by_device(reading, Scope.INTERFACE)) == ["eth0", "ib0"]
    assert source.read_errors == 0


def test_missing_proc_files_give_nan_host_and_count_errors(tmp_path: Path) -> None:
    source = NetworkSource(tmp_path / "no-proc", make_sys(tmp_path / "sys"))
    reading = source.read()
    assert by_device(reading, Scope.INTERFACE) == {}
    assert reading.host is not None
    assert all(math.isnan(v) for v in reading.host)
    assert len(by_device(reading, Scope.IB_PORT)) == 2
    assert source.read_errors == 3  # net/dev, net/snmp, the "N/A" counter


def test_malformed_snmp_is_an_error_not_a_crash(tmp_path: Path) -> None:
    proc = make_proc(tmp_path / "proc", snmp="Tcp: RtoAlgorithm RetransSegs\nUdp: 1 2\n")
    source = NetworkSource(proc, tmp_path / "sys")
    reading = source.read()
    assert math.isnan(host_value(reading, "tcp_retrans_segs"))
    assert source.read_errors == 1


# -- NetworkSource on this machine --------------------------------------------------------------


def send_over_loopback(nbytes: int) -> None:
    with (
        socket.create_server(("127.0.0.1", 0)) as server,
        socket.create_connection(server.getsockname()) as client,
    ):
        conn, _ = server.accept()
        with conn:
            client.sendall(b"x" * nbytes)
            received = 0
            while received < nbytes:
                chunk = conn.recv(65536)
                assert chunk
                received += len(chunk)


def test_real_proc_loopback_counts_traffic() -> None:
    if not Path("/proc/net/dev").exists():
        missing_part("no /proc/net/dev on this machine")
    source = NetworkSource(Path("/proc"), Path("/sys"), interfaces=["lo"])
    before = source.read()
    lo_before = by_device(before, Scope.INTERFACE)["lo"].get("net_rx_bytes")
    assert lo_before >= 0
    for name in ("tcp_retrans_segs", "tcp_out_segs", "tcp_in_errs"):
        assert host_value(before, name) >= 0
    nbytes = 256 * 1024
    send_over_loopback(nbytes)
    lo_after = by_device(source.read(), Scope.INTERFACE)["lo"].get("net_rx_bytes")
    assert lo_after - lo_before >= nbytes
    assert source.read_errors == 0


# -- PeerProber ---------------------------------------------------------------------------------


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    with socket.create_server(("127.0.0.1", 0), backlog=128) as server:
        yield server


def closed_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as sock:
        port: int = sock.getsockname()[1]
    return port


@pytest.fixture
def blackhole() -> Iterator[tuple[str, int]]:
    """A listener whose accept queue is full: the kernel drops new SYNs, so connects time out."""
    server = socket.create_server(("127.0.0.1", 0), backlog=0)
    fillers: list[socket.socket] = []
    try:
        for _ in range(8):
            filler = socket.socket()
            filler.settimeout(0.2)
            fillers.append(filler)
            try:
                filler.connect(server.getsockname())
            except TimeoutError:
                break
        else:
            missing_part("this kernel accepts past a full backlog: no way to make a peer that never answers")
        yield server.getsockname()
    finally:
        for filler in fillers:
            filler.close()
        server.close()


def test_live_peer_has_no_loss(listener: socket.socket) -> None:
    host, port = listener.getsockname()
    prober = PeerProber([(host, port)], timeout=1.0, window=10)
    for _ in range(5):
        prober.probe_once()
    stats = prober.stats()[f"{host}:{port}"]
    assert stats.loss_ratio == 0.0
    assert 0 < stats.p50_seconds <= stats.p99_seconds < 1.0
    assert math.isfinite(stats.p99_seconds)
    assert stats.probes == 5
    assert stats.in_window == 5
    assert stats.last_error is None


class ScriptedClock:
    """Each probe reads the clock twice (before and after connect): the gaps are the round trips."""

    def __init__(self, round_trips: list[float]) -> None:
        self.readings: list[float] = []
        for i, rtt in enumerate(round_trips):
            self.readings += [10.0 * i, 10.0 * i + rtt]
        self.readings.reverse()

    def __call__(self) -> float:
        return self.readings.pop()


def test_percentiles_over_the_window(listener: socket.socket) -> None:
    host, port = listener.getsockname()
    round_trips = [0.005, 0.001, 0.004, 0.002, 0.003]
    prober = PeerProber([(host, port)], clock=ScriptedClock(round_trips), window=len(round_trips))
    for _ in round_trips:
        prober.probe_once()
    stats = prober.stats()[peer_id(host, port)]
    assert stats.p50_seconds == pytest.approx(0.003)
    assert stats.p99_seconds == pytest.approx(0.004 + 0.96 * 0.001)  # linear between closest ranks
    assert stats.loss_ratio == 0.0


def test_closed_port_is_all_loss() -> None:
    port = closed_port()
    prober = PeerProber([("127.0.0.1", port)], timeout=0.5)
    for _ in range(3):
        prober.probe_once()
    stats = prober.stats()[f"127.0.0.1:{port}"]
    assert stats.loss_ratio == 1.0
    assert math.isnan(stats.p50_seconds)
    assert math.isnan(stats.p99_seconds)
    assert stats.probes == 3
    assert stats.last_error is not None
    assert "ConnectionRefused" in stats.last_error


def test_mixed_window_loss_ratio_and_eviction() -> None:
    server = socket.create_server(("127.0.0.1", 0), backlog=128)
    host, port = server.getsockname()
    prober = PeerProber([(host, port)], timeout=0.5, window=4)
    for _ in range(3):
        prober.probe_once()
    server.close()
    prober.probe_once()
    stats = prober.stats()[f"{host}:{port}"]
    assert stats.loss_ratio == 1 / 4
    assert stats.probes == 4
    assert math.isfinite(stats.p50_seconds)
    prober.probe_once()
    prober.probe_once()  # the window now holds 1 success and 3 losses
    stats = prober.stats()[f"{host}:{port}"]
    assert stats.loss_ratio == 3 / 4
    assert stats.probes == 6
    assert stats.in_window == 4
    assert math.isfinite(stats.p50_seconds)
    prober.probe_once()  # the last success leaves the window
    stats = prober.stats()[f"{host}:{port}"]
    assert stats.loss_ratio == 1.0
    assert math.isnan(stats.p50_seconds)


def test_dead_peer_times_out_and_the_others_still_answer(
    listener: socket.socket, blackhole: tuple[str, int]
) -> None:
    live = listener.getsockname()
    refused = ("127.0.0.1", closed_port())
    timeout = 0.5
    prober = PeerProber([blackhole, live, refused], timeout=timeout)
    try:
        prober.probe_once()
        stats = prober.stats()
    finally:
        prober.close()
    assert stats[peer_id(*blackhole)].loss_ratio == 1.0
    assert "Timeout" in (stats[peer_id(*blackhole)].last_error or "")
    assert stats[peer_id(*refused)].loss_ratio == 1.0
    assert stats[peer_id(*live)].loss_ratio == 0.0
    assert stats[peer_id(*live)].p50_seconds < timeout
    assert all(s.probes == 1 for s in stats.values())


def test_duplicate_peers_are_probed_once(listener: socket.socket) -> None:
    live = listener.getsockname()
    prober = PeerProber([live, live])
    prober.probe_once()
    stats = prober.stats()
    assert list(stats) == [peer_id(*live)]
    assert stats[peer_id(*live)].probes == 1


def test_dead_peers_are_probed_at_the_same_time(blackhole: tuple[str, int]) -> None:
    """Each probe reads the clock as it starts; the clock waits until both probes have started.
    Probing one peer after the other would leave the first waiting, and the barrier would break."""
    second = socket.create_server(("127.0.0.1", 0), backlog=0)
    filler = socket.socket()
    filler.settimeout(0.2)
    both_started = threading.Barrier(2, timeout=10.0)

    def clock() -> float:
        both_started.wait()
        return time.monotonic()

    try:
        filler.connect(second.getsockname())
        prober = PeerProber([blackhole, second.getsockname()], timeout=0.5, clock=clock)
        prober.probe_once()
        prober.close()
    finally:
        filler.close()
        second.close()
    assert all(s.loss_ratio == 1.0 for s in prober.stats().values())
    assert not both_started.broken


def test_stats_before_any_probe() -> None:
    stats = PeerProber([("node-b", 22)]).stats()["node-b:22"]
    assert stats.probes == 0
    assert stats.in_window == 0
    assert math.isnan(stats.loss_ratio)
    assert math.isnan(stats.p50_seconds)


def wait_until(condition: object, deadline_s: float = 10.0) -> bool:
    assert callable(condition)
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.005)
    return bool(condition())


def test_background_thread_probes_and_close_returns_promptly(listener: socket.socket) -> None:
    host, port = listener.getsockname()
    # A long interval: only Event.wait lets close() end the thread before the next round.
    prober = PeerProber([(host, port)], interval=3600.0, timeout=1.0).start()
    try:
        assert wait_until(lambda: prober.stats()[peer_id(host, port)].probes >= 1)
        assert prober.running
    finally:
        prober.close()
    assert not prober.running
    assert prober.stats()[peer_id(host, port)].probes == 1
    with pytest.raises(RuntimeError):
        prober.start()


def test_background_thread_keeps_probing(listener: socket.socket) -> None:
    host, port = listener.getsockname()
    prober = PeerProber([(host, port)], interval=0.01, timeout=1.0).start()
    try:
        assert wait_until(lambda: prober.stats()[peer_id(host, port)].probes >= 5)
    finally:
        prober.close()
    assert prober.stats()[peer_id(host, port)].loss_ratio == 0.0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("node-b:2222", ("node-b", 2222)),
        ("node-b", ("node-b", DEFAULT_PEER_PORT)),
        ("10.0.0.7:80", ("10.0.0.7", 80)),
        ("[fe80::1]:8080", ("fe80::1", 8080)),
        ("[::1]", ("::1", DEFAULT_PEER_PORT)),
        ("::1", ("::1", DEFAULT_PEER_PORT)),
    ],
)
def test_parse_peer(text: str, expected: tuple[str, int]) -> None:
    assert parse_peer(text) == expected


@pytest.mark.parametrize("text", ["", ":22", "node-b:x", "node-b:0", "node-b:70000", "[::1", "[::1]x"])
def test_parse_peer_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="bad peer"):
        parse_peer(text)


def test_peer_id_brackets_ipv6() -> None:
    assert peer_id("::1", 22) == "[::1]:22"
    assert peer_id("node-b", 22) == "node-b:22"


# -- NetworkSource with a prober ----------------------------------------------------------------


def test_source_reports_peer_stats(tmp_path: Path, listener: socket.socket) -> None:
    live = listener.getsockname()
    dead = ("127.0.0.1", closed_port())
    prober = PeerProber([live, dead], timeout=0.5)
    source = NetworkSource(make_proc(tmp_path / "proc"), tmp_path / "sys", prober=prober)
    for _ in range(3):
        prober.probe_once()
    peers = by_device(source.read(), Scope.PEER)
    expected = prober.stats()
    assert sorted(peers) == sorted(expected) == sorted([peer_id(*live), peer_id(*dead)])
    for pid, stats in expected.items():
        assert peers[pid].get("peer_probes") == stats.probes == 3
        assert peers[pid].get("peer_loss_ratio") == stats.loss_ratio
    assert peers[peer_id(*live)].get("peer_rtt_p50_seconds") == expected[peer_id(*live)].p50_seconds
    assert peers[peer_id(*live)].get("peer_rtt_p99_seconds") == expected[peer_id(*live)].p99_seconds
    assert peers[peer_id(*live)].get("peer_loss_ratio") == 0.0
    assert peers[peer_id(*dead)].get("peer_loss_ratio") == 1.0
    assert math.isnan(peers[peer_id(*dead)].get("peer_rtt_p50_seconds"))
    prober.start()
    source.close()  # the source owns the prober
    assert not prober.running
