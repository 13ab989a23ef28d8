"""Series names the importer reads besides the catalogue's own and dcgm-exporter's (faultcast.dcgm):
node_exporter's, and one dcgm-exporter default that stands in for a missing catalogue metric.

node_exporter (main at a7dcc3a, fetched 2026-12-06): the infiniband collector exports every port's
counters with labels `device` and `port` (collector/infiniband_linux.go, values from prometheus/procfs,
which already multiplies port_rcv_data and port_xmit_data by 4 into octets and reads `rate` as bytes
per second); the netstat collector exports /proc/net/snmp's Tcp fields by default as
`node_netstat_Tcp_<Field>` (untyped); the netdev collector exports /proc/net/dev per `device`. Port
counters roll up per node as the twin's and the service's do (faultcast.rollup: summed over ports,
the worst port's state).
"""

from __future__ import annotations

from dataclasses import dataclass

from faultcast.dcgm import PARITY

GR_ENGINE_ACTIVE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
"""dcgm-exporter's default graphics-engine activity, a 0-1 ratio: gpu_util (percent) x 0.01 for a
GPU that lacks DCGM_FI_DEV_GPU_UTIL (both measure the time a kernel ran; GR_ENGINE_ACTIVE is the
profiling counter, GPU_UTIL the NVML sampling), never added to a GPU that has it."""
GR_ENGINE_FACTOR = 100.0


@dataclass(frozen=True, slots=True)
class OtherName:
    """A series name of another exporter: the catalogue metric it is, and value x factor."""

    metric: str
    factor: float = 1.0
    conversion: str = ""  # said in the manifest when factor != 1


_IB = "node_infiniband_"
NODE_EXPORTER: dict[str, OtherName] = {
    f"{_IB}symbol_error_total": OtherName("ib_symbol_error"),
    f"{_IB}link_downed_total": OtherName("ib_link_downed"),
    f"{_IB}link_error_recovery_total": OtherName("ib_link_error_recovery"),
    f"{_IB}port_errors_received_total": OtherName("ib_port_rcv_errors"),
    f"{_IB}port_discards_transmitted_total": OtherName("ib_port_xmit_discards"),
    f"{_IB}local_link_integrity_errors_total": OtherName("ib_local_link_integrity_errors"),
    f"{_IB}excessive_buffer_overrun_errors_total": OtherName("ib_excessive_buffer_overrun_errors"),
    f"{_IB}port_data_received_bytes_total": OtherName("ib_port_rcv_data"),  # octets already (procfs x 4)
    f"{_IB}port_data_transmitted_bytes_total": OtherName("ib_port_xmit_data"),
    f"{_IB}rnr_nak_retry_packets_received_total": OtherName("ib_rnr_nak_retry_err"),
    f"{_IB}local_ack_timeout_errors_total": OtherName("ib_local_ack_timeout_err"),
    f"{_IB}out_of_sequence_packets_received_total": OtherName("ib_out_of_sequence"),
    f"{_IB}packet_sequence_errors_total": OtherName("ib_packet_seq_err"),
    f"{_IB}state_id": OtherName("ib_port_state"),  # 4 = ACTIVE, as the sysfs file
    f"{_IB}physical_state_id": OtherName("ib_port_phys_state"),  # 5 = LinkUp
    f"{_IB}rate_bytes_per_second": OtherName("ib_port_rate_gbps", 8e-9, "bytes/s -> Gb/s"),
    "node_netstat_Tcp_RetransSegs": OtherName("tcp_retrans_segs"),
    "node_netstat_Tcp_OutSegs": OtherName("tcp_out_segs"),
    "node_netstat_Tcp_InErrs": OtherName("tcp_in_errs"),
    "node_network_receive_bytes_total": OtherName("net_rx_bytes"),
    "node_network_receive_packets_total": OtherName("net_rx_packets"),
    "node_network_receive_errs_total": OtherName("net_rx_errors"),
    "node_network_receive_drop_total": OtherName("net_rx_dropped"),
    "node_network_transmit_bytes_total": OtherName("net_tx_bytes"),
    "node_network_transmit_packets_total": OtherName("net_tx_packets"),
    "node_network_transmit_errs_total": OtherName("net_tx_errors"),
    "node_network_transmit_drop_total": OtherName("net_tx_dropped"),
}
"""node_exporter's series name -> the catalogue metric it is."""

# Interfaces that are not a node's own link: the loopback (the collector leaves it out too) and the
# virtual devices of containers, bridges and overlays. The node's Ethernet is the first of the rest.
_VIRTUAL_INTERFACES = ("lo", "docker", "veth", "br-", "virbr", "cali", "flannel", "cni", "vxlan", "tunl",
                       "kube-", "cilium", "lxc", "weave", "tap", "tun")  # fmt: skip


def virtual_interface(device: str) -> bool:
    """Whether a node_exporter interface is the loopback or a virtual device (left out)."""
    return device == "lo" or device.startswith(_VIRTUAL_INTERFACES[1:])


_PARITY_NAMES = frozenset(n for f in PARITY for n in (f.classic, f.canonical))


def why_unknown(name: str) -> str:
    """Why a series name the importer does not map is left out, in words for the summary."""
    if name in _PARITY_NAMES:
        return "a dcgm-exporter default the collector exports for parity; the model has no column for it"
    if name.startswith("DCGM_FI_"):
        return "a DCGM field the model has no column for"
    if name.startswith(_IB):
        return "a node_exporter InfiniBand counter the model has no column for"
    if name.startswith("node_"):
        return "a node_exporter metric the model does not read"
    if name.startswith("faultcast_"):
        return "not in this catalogue (another faultcast version?)"
    return "not a metric faultcast knows"
