"""The Kubernetes actuator through the real client against an in-process fake API server.

No API server binary runs here, so `FakeApiServer` speaks just the endpoints the actuator uses, the
way the real one does (Status bodies on errors, strategic-merge patches of a Node whose taint list is
atomic, resourceVersion preconditions, the Eviction subresource answering 429 for a disruption
budget). The client is a real `kubernetes.client.ApiClient`, so URL building, serialization, the
patch content type and the mapping of error statuses to exceptions are the client's own.
"""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, cast
from urllib.parse import parse_qs, urlsplit

import pytest
from kubernetes.client import ApiClient, Configuration, CoreV1Api

from faultcast.service.actuators import Remediation
from faultcast.service.kubernetes import ANNOTATION_KEY, TAINT_KEY, KubernetesActuator, label_value
from tests.conftest import refused_port

Json = dict[str, Any]
MERGE_TYPES = ("application/strategic-merge-patch+json", "application/merge-patch+json")
FOREIGN_TAINTS: list[Json] = [
    {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute", "timeAdded": "2024-05-01T12:00:00Z"},
]


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    content_type: str
    authorization: str
    body: Any


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386. For the fields the actuator sets, a strategic merge is the same: Node taints are atomic."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def status(code: int, reason: str, message: str, **details: Any) -> Json:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success" if code < 300 else "Failure",
        "message": message,
        "reason": reason,
        "code": code,
        **({"details": details} if details else {}),
    }


def node(name: str, taints: list[Json] | None = None) -> Json:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "resourceVersion": "1", "labels": {"kubernetes.io/hostname": name}},
        "spec": {"taints": copy.deepcopy(taints)} if taints else {},
        "status": {},
    }


def pod(namespace: str, name: str, node_name: str, labels: dict[str, str], phase: str = "Running") -> Json:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels, "resourceVersion": "1"},
        "spec": {"nodeName": node_name, "containers": [{"name": "trainer", "image": "trainer:1"}]},
        "status": {"phase": phase},
    }


def selected(obj: Json, selector: str, lookup: Callable[[Json, str], str | None]) -> bool:
    """Equality-based selectors (`k=v`, `k==v`, `k!=v`, comma for AND), as labelSelector/fieldSelector."""
    for term in filter(None, selector.split(",")):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if lookup(obj, key.strip()) == value.strip():
                return False
        else:
            key, value = term.replace("==", "=").split("=", 1)
            if lookup(obj, key.strip()) != value.strip():
                return False
    return True


def label_of(obj: Json, key: str) -> str | None:
    labels: dict[str, str] = obj["metadata"].get("labels") or {}
    return labels.get(key)


def field_of(obj: Json, key: str) -> str | None:
    fields: dict[str, str | None] = {
        "spec.nodeName": obj["spec"].get("nodeName"),
        "metadata.name": obj["metadata"]["name"],
        "metadata.namespace": obj["metadata"]["namespace"],
        "status.phase": obj["status"].get("phase"),
    }
    if key not in fields:
        raise LookupError(key)
    return fields[key]


class FakeApiServer:
    """In-memory nodes and pods behind GET/PATCH node, list pods, and the pod eviction subresource."""

    def __init__(self) -> None:
        self.nodes: dict[str, Json] = {}
        self.pods: dict[tuple[str, str], Json] = {}
        self.budget_blocked: set[tuple[str, str]] = set()  # evictions a PodDisruptionBudget refuses
        self.forbidden: set[str] = set()  # HTTP methods answered 403
        self.before_patch: list[Callable[[FakeApiServer], None]] = []  # concurrent writers, one per PATCH
        self.requests: list[Request] = []
        self.lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._server.daemon_threads = True
        cast(Any, self._server).fake = self
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> None:
        threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        ).start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def add_node(self, obj: Json) -> None:
        self.nodes[obj["metadata"]["name"]] = obj

    def add_pod(self, obj: Json) -> None:
        self.pods[(obj["metadata"]["namespace"], obj["metadata"]["name"])] = obj

    def seen(self, method: str, path_start: str = "/") -> list[Request]:
        return [r for r in self.requests if r.method == method and r.path.startswith(path_start)]

    def handle(self, request: Request) -> tuple[int, Json]:
        with self.lock:
            self.requests.append(request)
            if request.method in self.forbidden:
                return 403, status(403, "Forbidden", f"{request.method} {request.path} is forbidden")
            parts = request.path.strip("/").split("/")
            match request.method, parts:
                case "GET", ["api", "v1", "nodes", name]:
                    return self._get_node(name)
                case "PATCH", ["api", "v1", "nodes", name]:
                    return self._patch_node(name, request)
                case "GET", ["api", "v1", "pods"]:
                    return self._list_pods(None, request)
                case "GET", ["api", "v1", "namespaces", namespace, "pods"]:
                    return self._list_pods(namespace, request)
                case "POST", ["api", "v1", "namespaces", namespace, "pods", name, "eviction"]:
                    return self._evict(namespace, name, request)
            return 404, status(404, "NotFound", "the server could not find the requested resource")

    def _get_node(self, name: str) -> tuple[int, Json]:
        if name not in self.nodes:
            return 404, status(404, "NotFound", f'nodes "{name}" not found', name=name, kind="nodes")
        return 200, self.nodes[name]

    def _patch_node(self, name: str, request: Request) -> tuple[int, Json]:
        if request.content_type not in MERGE_TYPES:
            return 415, status(
                415, "UnsupportedMediaType", f"the patch type {request.content_type} is not handled"
            )
        if name not in self.nodes:
            return 404, status(404, "NotFound", f'nodes "{name}" not found', name=name, kind="nodes")
        while self.before_patch:
            self.before_patch.pop(0)(self)
        current = self.nodes[name]
        wanted = (request.body.get("metadata") or {}).get("resourceVersion")
        if wanted is not None and wanted != current["metadata"]["resourceVersion"]:
            message = f'Operation cannot be fulfilled on nodes "{name}": the object has been modified'
            return 409, status(409, "Conflict", message, name=name, kind="nodes")
        patched = merge_patch(current, request.body)
        patched["metadata"]["resourceVersion"] = str(int(current["metadata"]["resourceVersion"]) + 1)
        self.nodes[name] = patched
        return 200, patched

    def _list_pods(self, namespace: str | None, request: Request) -> tuple[int, Json]:
        labels = request.query.get("labelSelector", [""])[0]
        fields = request.query.get("fieldSelector", [""])[0]
        try:
            items = [
                p
                for (ns, _), p in sorted(self.pods.items())
                if namespace in (None, ns) and selected(p, labels, label_of) and selected(p, fields, field_of)
            ]
        except LookupError as exc:
            return 400, status(400, "BadRequest", f'field label not supported: "{exc.args[0]}"')
        return 200, {
            "apiVersion": "v1",
            "kind": "PodList",
            "metadata": {"resourceVersion": "1"},
            "items": items,
        }

    def _evict(self, namespace: str, name: str, request: Request) -> tuple[int, Json]:
        body = request.body
        if body.get("kind") != "Eviction" or body.get("apiVersion") != "policy/v1":
            return 400, status(400, "BadRequest", f"not a policy/v1 Eviction: {body}")
        if body["metadata"].get("name") != name:
            return 400, status(400, "BadRequest", "name in URL does not match name in Eviction object")
        if (namespace, name) not in self.pods:
            return 404, status(404, "NotFound", f'pods "{name}" not found', name=name, kind="pods")
        if (namespace, name) in self.budget_blocked:
            message = "Cannot evict pod as it would violate the pod's disruption budget."
            cause = {
                "reason": "DisruptionBudget",
                "message": "The disruption budget trainer-pdb needs 4 healthy pods",
            }
            return 429, status(429, "TooManyRequests", message, causes=[cause], retryAfterSeconds=10)
        del self.pods[(namespace, name)]
        return 201, status(201, "", "")


class _Handler(BaseHTTPRequestHandler):
    def _serve(self) -> None:
        url = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        request = Request(
            method=self.command,
            path=url.path,
            query=parse_qs(url.query),
            content_type=(self.headers.get("Content-Type") or "").split(";")[0].strip(),
            authorization=self.headers.get("Authorization") or "",
            body=json.loads(raw) if raw else None,
        )
        code, body = cast(Any, self.server).fake.handle(request)
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._serve()

    def do_PATCH(self) -> None:
        self._serve()

    def do_POST(self) -> None:
        self._serve()

    def log_message(self, format: str, *args: Any) -> None:  # quiet: the fake records requests itself
        pass


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
