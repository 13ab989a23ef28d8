"""An in-process fake of the Kubernetes API server, for the real client (tests of the Kubernetes
actuator and spares).

No API server binary runs here, so `FakeApiServer` speaks just the endpoints faultcast uses, the way
the real one does (Status bodies on errors, strategic-merge patches of a Node whose taint list is
atomic, resourceVersion preconditions, the Eviction subresource answering 429 for a disruption
budget, pod creation answering 409 AlreadyExists and 422 for an invalid name or label, pod deletion).
The client is a real `kubernetes.client.ApiClient`, so URL building, serialization, the patch content
type and the mapping of error statuses to exceptions are the client's own.
"""

from __future__ import annotations

import copy
import json
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast
from urllib.parse import parse_qs, urlsplit

Json = dict[str, Any]
# What the API server checks of a new pod's name (a DNS-1123 subdomain) and label values.
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")
MERGE_TYPES = ("application/strategic-merge-patch+json", "application/merge-patch+json")


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
    """In-memory nodes and pods behind GET/PATCH node, list, get, create and delete pods, and the
    pod eviction subresource."""

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
                case "GET", ["api", "v1", "namespaces", namespace, "pods", name]:
                    return self._get_pod(namespace, name)
                case "POST", ["api", "v1", "namespaces", namespace, "pods"]:
                    return self._create_pod(namespace, request)
                case "DELETE", ["api", "v1", "namespaces", namespace, "pods", name]:
                    return self._delete_pod(namespace, name)
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

    def _get_pod(self, namespace: str, name: str) -> tuple[int, Json]:
        if (namespace, name) not in self.pods:
            return 404, status(404, "NotFound", f'pods "{name}" not found', name=name, kind="pods")
        return 200, self.pods[(namespace, name)]

    def _create_pod(self, namespace: str, request: Request) -> tuple[int, Json]:
        body = request.body
        if not isinstance(body, dict) or body.get("kind") != "Pod" or body.get("apiVersion") != "v1":
            return 400, status(400, "BadRequest", f"not a v1 Pod: {body}")
        meta = body.get("metadata") or {}
        name = meta.get("name") or ""
        if meta.get("namespace") not in (None, namespace):
            return 400, status(400, "BadRequest", "the namespace of the object does not match the request")
        if not DNS_SUBDOMAIN.fullmatch(name):
            return 422, status(422, "Invalid", f'Pod "{name}" is invalid: metadata.name: Invalid value')
        bad = [v for v in (meta.get("labels") or {}).values() if not LABEL_VALUE.fullmatch(str(v))]
        if bad:
            return 422, status(422, "Invalid", f'Pod "{name}" is invalid: metadata.labels: {bad}')
        if (namespace, name) in self.pods:
            message = f'pods "{name}" already exists'
            return 409, status(409, "AlreadyExists", message, name=name, kind="pods")
        created = copy.deepcopy(body)
        created["metadata"] = {**meta, "namespace": namespace, "resourceVersion": "1"}
        created["status"] = {"phase": "Pending"}
        self.pods[(namespace, name)] = created
        return 201, created

    def _delete_pod(self, namespace: str, name: str) -> tuple[int, Json]:
        if (namespace, name) not in self.pods:
            return 404, status(404, "NotFound", f'pods "{name}" not found', name=name, kind="pods")
        return 200, self.pods.pop((namespace, name))

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

    def do_DELETE(self) -> None:
        self._serve()

    def log_message(self, format: str, *args: Any) -> None:  # quiet: the fake records requests itself
        pass
