"""The Kubernetes actuator through the real client against an in-process fake API server
(tests/k8s_fake.py: the endpoints the actuator uses, answered the way the real one answers)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client import ApiClient, Configuration, CoreV1Api

from faultcast.service.remediation.actuators import Remediation
from faultcast.service.remediation.kubernetes import (
    ANNOTATION_KEY,
    TAINT_KEY,
    KubernetesActuator,
    label_value,
)
from faultcast.testing.system import refused_port
from tests.k8s_fake import FakeApiServer, Json, node, pod

FOREIGN_TAINTS: list[Json] = [
    {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute", "timeAdded": "2024-05-01T12:00:00Z"},
]


@pytest.fixture
def server() -> Iterator[FakeApiServer]:
    fake = FakeApiServer()
    fake.add_node(node("node-1", FOREIGN_TAINTS))
    fake.add_node(node("node-2"))
    job_a = {"faultcast.io/job": "job-a", "team": "ml"}
    job_b = {"faultcast.io/job": "job-b", "team": "ml"}
    fake.add_pod(pod("train", "a-0", "node-1", job_a))
    fake.add_pod(pod("train", "a-1", "node-1", job_a))
    fake.add_pod(pod("train", "a-2", "node-2", job_a))  # the job elsewhere
    fake.add_pod(pod("train", "b-0", "node-1", job_b))  # another job on the node
    fake.add_pod(pod("train", "a-done", "node-1", job_a, phase="Succeeded"))
    fake.add_pod(pod("eval", "a-eval", "node-1", {"faultcast.io/job": "job-a", "team": "eval"}))
    fake.start()
    yield fake
    fake.stop()


@pytest.fixture
def api(server: FakeApiServer) -> Iterator[ApiClient]:
    with ApiClient(Configuration(host=server.url)) as client:
        yield client


def alert(
    node: str = "node-1", *, job_id: str = "job-a", requeue: bool = True, mode: str = "hbm_wear"
) -> Remediation:
    return Remediation(alert_id=42, node=node, gpu=3, mode=mode, risk=0.91, job_id=job_id, requeue=requeue)


def our_taints(server: FakeApiServer, name: str = "node-1") -> list[Json]:
    return [t for t in server.nodes[name]["spec"].get("taints", []) if t["key"] == TAINT_KEY]


def test_node_is_cordoned_tainted_and_annotated(server: FakeApiServer, api: ApiClient) -> None:
    outcome = KubernetesActuator(api).remediate(alert(requeue=False))

    assert outcome.ok, outcome.detail
    assert "node-1" in outcome.detail
    node_1 = server.nodes["node-1"]
    assert node_1["spec"]["unschedulable"] is True
    assert our_taints(server) == [{"key": TAINT_KEY, "value": "hbm_wear", "effect": "NoSchedule"}]
    annotation = node_1["metadata"]["annotations"][ANNOTATION_KEY]
    assert annotation == alert().reason
    assert "alert 42" in annotation
    (patch,) = server.seen("PATCH")
    assert patch.content_type == "application/strategic-merge-patch+json"
    assert patch.body["metadata"]["resourceVersion"] == "1"  # the precondition from the read


def test_foreign_taints_are_kept_and_ours_is_not_duplicated(server: FakeApiServer, api: ApiClient) -> None:
    actuator = KubernetesActuator(api)

    assert actuator.remediate(alert(requeue=False)).ok
    assert actuator.remediate(alert(requeue=False, mode="xid 79 / fell off bus")).ok

    taints = server.nodes["node-1"]["spec"]["taints"]
    assert [t for t in taints if t["key"] != TAINT_KEY] == FOREIGN_TAINTS  # timeAdded round-trips unchanged
    assert our_taints(server) == [
        {"key": TAINT_KEY, "value": label_value("xid 79 / fell off bus"), "effect": "NoSchedule"}
    ]
    assert len(server.seen("PATCH")) == 2


def test_taint_effect_is_configurable(server: FakeApiServer, api: ApiClient) -> None:
    assert KubernetesActuator(api, taint_effect="NoExecute").remediate(alert(node="node-2", requeue=False)).ok
    assert our_taints(server, "node-2") == [{"key": TAINT_KEY, "value": "hbm_wear", "effect": "NoExecute"}]


def test_only_the_jobs_pods_on_the_node_are_evicted(server: FakeApiServer, api: ApiClient) -> None:
    outcome = KubernetesActuator(api).remediate(alert())

    assert outcome.ok, outcome.detail
    evicted = {("train", "a-0"), ("train", "a-1"), ("eval", "a-eval")}
    assert {(r.path.split("/")[4], r.path.split("/")[6]) for r in server.seen("POST")} == evicted
    assert evicted.isdisjoint(server.pods)
    assert {("train", "a-2"), ("train", "b-0"), ("train", "a-done")} <= set(server.pods)
    (listing,) = server.seen("GET", "/api/v1/pods")  # every namespace by default
    assert listing.query["labelSelector"] == ["faultcast.io/job=job-a"]
    assert listing.query["fieldSelector"] == ["spec.nodeName=node-1"]
    assert all(f"train/{name}" in outcome.detail for name in ("a-0", "a-1"))


def test_namespace_and_selector_are_configurable(server: FakeApiServer, api: ApiClient) -> None:
    actuator = KubernetesActuator(api, namespace="eval", job_selector="team=eval,faultcast.io/job={job_id}")

    assert actuator.remediate(alert()).ok

    assert [r.path for r in server.seen("GET", "/api/v1/namespaces/")] == ["/api/v1/namespaces/eval/pods"]
    assert [r.path for r in server.seen("POST")] == ["/api/v1/namespaces/eval/pods/a-eval/eviction"]
    assert ("train", "a-0") in server.pods


def test_an_actuator_can_take_a_core_api(server: FakeApiServer, api: ApiClient) -> None:
    assert KubernetesActuator(CoreV1Api(api)).remediate(alert(requeue=False)).ok
    assert server.nodes["node-1"]["spec"]["unschedulable"] is True


def test_client_from_a_kubeconfig(server: FakeApiServer, tmp_path: Path) -> None:
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fake", "cluster": {"server": server.url}}],
        "users": [{"name": "faultcast", "user": {"token": "s3cret"}}],
        "contexts": [
            {"name": "other", "context": {"cluster": "nowhere", "user": "faultcast"}},
            {"name": "fake", "context": {"cluster": "fake", "user": "faultcast"}},
        ],
        "current-context": "other",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps(kubeconfig))  # JSON is YAML

    actuator = KubernetesActuator.from_kubeconfig(str(path), context="fake", taint_effect="NoExecute")
    try:
        assert actuator.remediate(alert(requeue=False)).ok
    finally:
        actuator.core.api_client.close()

    assert our_taints(server) == [{"key": TAINT_KEY, "value": "hbm_wear", "effect": "NoExecute"}]
    assert {r.authorization for r in server.requests} == {"Bearer s3cret"}


def test_no_requeue_evicts_nothing(server: FakeApiServer, api: ApiClient) -> None:
    pods_before = set(server.pods)

    assert KubernetesActuator(api).remediate(alert(requeue=False)).ok

    assert set(server.pods) == pods_before
    assert not server.seen("POST")
    assert not server.seen("GET", "/api/v1/pods")


def test_no_job_on_the_node_evicts_nothing(server: FakeApiServer, api: ApiClient) -> None:
    outcome = KubernetesActuator(api).remediate(alert(job_id=""))

    assert outcome.ok, outcome.detail
    assert "nothing to evict" in outcome.detail
    assert not server.seen("POST")


def test_unknown_node_is_reported_not_raised(server: FakeApiServer, api: ApiClient) -> None:
    outcome = KubernetesActuator(api).remediate(alert(node="node-404"))

    assert not outcome.ok
    assert "404" in outcome.detail
    assert "not found" in outcome.detail
    assert "node-404" in outcome.detail
    assert not server.seen("PATCH")
    assert not server.seen("POST")


def test_forbidden_patch_stops_before_evicting(server: FakeApiServer, api: ApiClient) -> None:
    server.forbidden.add("PATCH")

    outcome = KubernetesActuator(api).remediate(alert())

    assert not outcome.ok
    assert "403" in outcome.detail
    assert "forbidden" in outcome.detail
    assert "unschedulable" not in server.nodes["node-1"]["spec"]
    assert not server.seen("POST")


def test_eviction_refused_by_a_disruption_budget(server: FakeApiServer, api: ApiClient) -> None:
    server.budget_blocked.add(("train", "a-1"))

    outcome = KubernetesActuator(api).remediate(alert())

    assert not outcome.ok
    assert "disruption budget" in outcome.detail
    assert "train/a-1" in outcome.detail
    assert ("train", "a-1") in server.pods  # still running
    assert ("train", "a-0") not in server.pods  # the others went
    assert server.nodes["node-1"]["spec"]["unschedulable"] is True


def test_a_concurrent_node_change_is_retried_and_kept(server: FakeApiServer, api: ApiClient) -> None:
    added = {"key": "example.com/maintenance", "value": "true", "effect": "NoSchedule"}

    def operator_taints(fake: FakeApiServer) -> None:  # lands between the actuator's read and its patch
        current = fake.nodes["node-1"]
        current["spec"]["taints"].append(added)
        current["metadata"]["resourceVersion"] = str(int(current["metadata"]["resourceVersion"]) + 1)

    server.before_patch.append(operator_taints)

    assert KubernetesActuator(api).remediate(alert(requeue=False)).ok

    assert len(server.seen("PATCH")) == 2  # a 409, then a patch built from the fresh read
    assert server.nodes["node-1"]["spec"]["taints"] == [*FOREIGN_TAINTS, added, *our_taints(server)]
    assert len(our_taints(server)) == 1


def test_unreachable_api_server_is_reported_not_raised() -> None:
    with refused_port() as port, ApiClient(Configuration(host=f"http://127.0.0.1:{port}")) as client:
        outcome = KubernetesActuator(client, timeout_s=2.0).remediate(alert())

    assert not outcome.ok
    assert "unreachable" in outcome.detail


@pytest.mark.parametrize(
    "options",
    [{"taint_effect": "NoRun"}, {"job_selector": "faultcast.io/job=job-a"}, {"timeout_s": 0.0}],
)
def test_bad_settings_are_refused(api: ApiClient, options: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"."):
        KubernetesActuator(api, **options)


@pytest.mark.parametrize(
    ("mode", "value"), [("hbm_wear", "hbm_wear"), ("xid 79", "xid_79"), ("", "unknown"), ("__", "unknown")]
)
def test_taint_values_are_valid_label_values(mode: str, value: str) -> None:
    assert label_value(mode) == value


def test_long_taint_values_are_cut_to_a_valid_label_value() -> None:
    value = label_value("-" + "x." * 100)
    assert len(value) <= 63
    assert value[0].isalnum()
    assert value[-1].isalnum()
