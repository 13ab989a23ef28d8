"""Kubernetes actuator: cordon and taint the node, then evict the job's pods on it (or, after a
hand-over to a standby, delete them).

Everything goes through the official client (`pip install faultcast[kubernetes]`), imported lazily so
the rest of the service runs without it. The client comes in through the constructor; the
`from_kubeconfig` and `in_cluster` classmethods build one the usual ways.

What the service account needs: get and patch on nodes, list on pods (in the configured namespace, or
cluster-wide), create on pods/eviction, and delete on pods (hand-overs).

When a standby took the job over at its snapshot (`Remediation.handover_to`, a pre-scheduled spare:
service/remediation/spares/kubernetes.py), the job's pods on the node are deleted, not evicted: an eviction goes
through the job's PodDisruptionBudget, which would hold the old pod up (429) while the standby already
trains from the same snapshot. Deleting a pod ends the job only when nothing starts it again. A bare
pod (no controller) stays deleted: the standby pods of service/remediation/spares/kubernetes.py are bare, and it
readies none for a pod that has a controller unless told to. A controller does start it again: a
batch/v1 Job counts the deleted pod as failed and creates another while its backoffLimit allows (with
backoffLimit 0, or a podFailurePolicy that fails the Job, the Job fails instead), and JobSet and the
Kubeflow training operator (PyTorchJob) recreate their replicas. The new pod is an ordinary run of
the job (the handed-over copy's own stop after its hold, client/protection.py, is not its): it would
resume from the same snapshot beside the standby. Ending such a job means suspending or deleting the
controller's object, which this actuator does not do: the outcome names each deleted pod's
controller so an operator sees it.

The node is changed with one strategic-merge patch carrying its `resourceVersion` as a precondition:
a Node's taint list is atomic (a patch replaces it whole), so the actuator reads the taints, keeps the
ones it does not own, adds its own, and retries on a 409 should another writer (the node lifecycle
controller, an operator's `kubectl taint`) change the node in between.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import replace
from datetime import UTC
from typing import TYPE_CHECKING, Any

from faultcast.service.remediation.actuators import Outcome, Remediation

if TYPE_CHECKING:
    from kubernetes.client import ApiClient, CoreV1Api, V1Pod, V1Taint

log = logging.getLogger(__name__)

TAINT_KEY = "faultcast.io/predicted-failure"
ANNOTATION_KEY = "faultcast.io/alert"
JOB_LABEL = "faultcast.io/job"
DEFAULT_JOB_SELECTOR = JOB_LABEL + "={job_id}"
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
STRATEGIC_MERGE = "application/strategic-merge-patch+json"

_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")


class _StepFailedError(Exception):
    """An expected failure: its message becomes the outcome's detail."""


def is_label_value(text: str) -> bool:
    """Whether `text` may stand as a label value (and so in an equality selector) as it is."""
    return bool(_LABEL_VALUE.match(text))


def client_from_kubeconfig(path: str | None = None, context: str | None = None) -> ApiClient:
    """A client from a kubeconfig file (default: $KUBECONFIG or ~/.kube/config)."""
    from kubernetes import config

    client: ApiClient = config.new_client_from_config(  # type: ignore[no-untyped-call]  # untyped
        config_file=path, context=context, persist_config=False
    )
    return client


def client_in_cluster() -> ApiClient:
    """A client from the pod's service account (token and CA under /var/run/secrets)."""
    from kubernetes import config
    from kubernetes.client import ApiClient, Configuration

    configuration = Configuration()
    config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    return ApiClient(configuration)


def label_value(text: str) -> str:
    """`text` as a valid label (and taint) value: at most 63 of [A-Za-z0-9._-], alphanumeric ends."""
    value = re.sub(r"[^A-Za-z0-9._-]+", "_", text)[:63].strip("._-")
    return value or "unknown"


class KubernetesActuator:
    """Cordons the node, taints it with the failure mode, and (on requeue) evicts the job's pods there.

    `api` is a `kubernetes.client.ApiClient` or a `CoreV1Api`. `job_selector` is a label selector with a
    `{job_id}` placeholder; `namespace=None` looks for the job's pods in every namespace. Evictions go
    through the Eviction API, so PodDisruptionBudgets are honoured: a refused eviction is reported.
    """

    name = "kubernetes"

    def __init__(
        self,
        api: ApiClient | CoreV1Api,
        *,
        taint_key: str = TAINT_KEY,
        taint_effect: str = "NoSchedule",
        annotation_key: str = ANNOTATION_KEY,
        job_selector: str = DEFAULT_JOB_SELECTOR,
        namespace: str | None = None,
        grace_period_s: int | None = None,
        timeout_s: float = 10.0,
        conflict_retries: int = 3,
    ) -> None:
        from kubernetes.client import CoreV1Api

        if taint_effect not in TAINT_EFFECTS:
            raise ValueError(f"taint effect must be one of {', '.join(TAINT_EFFECTS)}: {taint_effect!r}")
        if "{job_id}" not in job_selector:
            raise ValueError(f"the job selector needs a {{job_id}} placeholder: {job_selector!r}")
        if timeout_s <= 0 or conflict_retries < 0:
            raise ValueError("the Kubernetes actuator needs a positive timeout and conflict_retries >= 0")
        self.core = api if isinstance(api, CoreV1Api) else CoreV1Api(api)
        self.taint_key, self.taint_effect, self.annotation_key = taint_key, taint_effect, annotation_key
        self.job_selector, self.namespace, self.grace_period_s = job_selector, namespace, grace_period_s
        self.timeout_s, self.conflict_retries = timeout_s, conflict_retries

    @classmethod
    def from_kubeconfig(
        cls, path: str | None = None, context: str | None = None, **options: Any
    ) -> KubernetesActuator:
        """Builds the client from a kubeconfig file (default: $KUBECONFIG or ~/.kube/config)."""
        return cls(client_from_kubeconfig(path, context), **options)

    @classmethod
    def in_cluster(cls, **options: Any) -> KubernetesActuator:
        """Builds the client from the pod's service account (token and CA under /var/run/secrets)."""
        return cls(client_in_cluster(), **options)

    def remediate(self, remediation: Remediation) -> Outcome:
        """Cordon and taint the node (and evict the job's pods when `requeue`, or delete them when
        `handover_to` names the standby that carries the job on); never raises for an API refusal,
        which is an Outcome that is not ok."""
        import urllib3
        from kubernetes.client.exceptions import ApiException

        node = remediation.node
        done: list[str] = []
        try:
            done.append(self._cordon_and_taint(remediation))
            if remediation.handover_to:
                return self._end_handed_over(remediation, done)
            if remediation.requeue and not remediation.job_id:
                done.append("no job registered on the node, nothing to evict")
            refused: list[str] = []
            for job in remediation.requeued:  # the alert's job, then the other jobs a failure moves
                evicted, refusals = self._evict_job(replace(remediation, job_id=job))
                pods = ", ".join(evicted) if evicted else "none"
                done.append(f"evicted {len(evicted)} pod(s) of job {job}: {pods}")
                if job == remediation.job_id:
                    refused += refusals  # the alert's own job decides, as on Slurm
                else:
                    done += refusals
        except _StepFailedError as exc:
            return Outcome(False, "kubernetes: " + "; ".join([*done, str(exc)]))
        except ApiException as exc:
            return Outcome(False, "kubernetes: " + "; ".join([*done, f"node {node}: {api_error(exc)}"]))
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            return Outcome(False, "kubernetes: " + "; ".join([*done, f"API server unreachable: {exc}"]))
        return Outcome(not refused, "kubernetes: " + "; ".join(done + refused))

    def _cordon_and_taint(self, remediation: Remediation) -> str:
        """One patch: unschedulable, our taint in place of any earlier one, the alert annotation."""
        from kubernetes.client.exceptions import ApiException

        ours = {"key": self.taint_key, "value": label_value(remediation.mode), "effect": self.taint_effect}
        attempt = 0
        while True:
            try:
                current = self.core.read_node(remediation.node, _request_timeout=self.timeout_s)
            except ApiException as exc:
                raise _StepFailedError(f"node {remediation.node}: {api_error(exc)}") from exc
            kept = [_taint_dict(t) for t in (current.spec.taints if current.spec else None) or []]
            patch = {
                "metadata": {
                    # A precondition: the patch fails with 409 if the node changed since it was read.
                    "resourceVersion": current.metadata.resource_version if current.metadata else None,
                    "annotations": {self.annotation_key: remediation.reason},
                },
                "spec": {
                    "unschedulable": True,
                    "taints": [t for t in kept if t["key"] != self.taint_key] + [ours],
                },
            }
            try:
                self.core.patch_node(
                    remediation.node, patch, _content_type=STRATEGIC_MERGE, _request_timeout=self.timeout_s
                )
            except ApiException as exc:
                if exc.status == 409 and attempt < self.conflict_retries:
                    attempt += 1
                    log.info("node %s changed while tainting it, retrying", remediation.node)
                    continue
                raise _StepFailedError(f"node {remediation.node}: {api_error(exc)}") from exc
            log.info("cordoned and tainted node %s (%s)", remediation.node, remediation.reason)
            return f"cordoned node {remediation.node}, tainted {self.taint_key}={ours['value']}:{self.taint_effect}"

    def _job_pods(self, remediation: Remediation) -> list[tuple[str, str]]:
        """(namespace, name) of the job's pods on the node that are still running or pending."""
        return [(namespace, name) for namespace, name, _ in self._job_pods_owned(remediation)]

    def _job_pods_owned(self, remediation: Remediation) -> list[tuple[str, str, str]]:
        """(namespace, name, controller) of the job's pods on the node that are still running or
        pending; controller is "Kind/name" of the pod's controlling owner, "" for a bare pod."""
        from kubernetes.client.exceptions import ApiException

        if not _LABEL_VALUE.match(remediation.job_id):
            raise _StepFailedError(
                f"job id {remediation.job_id!r} is not a valid label value, evicted nothing"
            )
        selector = self.job_selector.replace("{job_id}", remediation.job_id)
        on_node = f"spec.nodeName={remediation.node}"
        try:
            if self.namespace is None:
                pods = self.core.list_pod_for_all_namespaces(
                    label_selector=selector, field_selector=on_node, _request_timeout=self.timeout_s
                )
            else:
                pods = self.core.list_namespaced_pod(
                    self.namespace,
                    label_selector=selector,
                    field_selector=on_node,
                    _request_timeout=self.timeout_s,
                )
        except ApiException as exc:
            where = "all namespaces" if self.namespace is None else f"namespace {self.namespace}"
            raise _StepFailedError(
                f"listing the pods of job {remediation.job_id} in {where}: {api_error(exc)}"
            ) from exc
        return [
            (pod.metadata.namespace or "default", pod.metadata.name or "", _controller(pod))
            for pod in pods.items or []
            if pod.metadata is not None
            and pod.metadata.deletion_timestamp is None  # terminating already
            and (pod.status is None or pod.status.phase not in ("Succeeded", "Failed"))
        ]

    def _end_handed_over(self, remediation: Remediation, done: list[str]) -> Outcome:
        """The standby carries the job on from its snapshot: delete the job's pods on the node
        (no eviction: a disruption budget must not keep the old job up beside the standby)."""
        standby = remediation.handover_to
        if not remediation.job_id:
            done.append(f"no job registered on the node, nothing to end (standby {standby})")
            return Outcome(True, "kubernetes: " + "; ".join(done))
        deleted, failed = self._delete_job(remediation)
        pods = ", ".join(deleted) if deleted else "none"
        done.append(
            f"deleted {len(deleted)} pod(s) of job {remediation.job_id}: {pods}; "
            f"handed over to standby {standby}"
        )
        return Outcome(not failed, "kubernetes: " + "; ".join(done + failed))

    def _delete_job(self, remediation: Remediation) -> tuple[list[str], list[str]]:
        """Deletes every running pod of the job on the node; returns (deleted, failures)."""
        import urllib3
        from kubernetes.client.exceptions import ApiException

        deleted: list[str] = []
        failed: list[str] = []
        for namespace, name, controller in self._job_pods_owned(remediation):
            # A controller starts a deleted pod again: said with the pod (see the module's docstring).
            owned = f" (run by {controller}: it may start the pod again)" if controller else ""
            try:
                self.core.delete_namespaced_pod(
                    name, namespace, grace_period_seconds=self.grace_period_s, _request_timeout=self.timeout_s
                )
            except ApiException as exc:
                if exc.status == 404:  # gone already: what the deletion wanted
                    deleted.append(f"{namespace}/{name} (already gone)")
                    continue
                failed.append(f"deleting {namespace}/{name} failed: {api_error(exc)}")
                log.warning("could not delete %s/%s from node %s", namespace, name, remediation.node)
                continue
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                failed.append(f"deleting {namespace}/{name} failed: API server unreachable: {exc}")
                break
            log.info(
                "deleted %s/%s from node %s: standby %s carries the job on%s",
                namespace,
                name,
                remediation.node,
                remediation.handover_to,
                owned,
            )
            deleted.append(f"{namespace}/{name}{owned}")
        return deleted, failed

    def _evict_job(self, remediation: Remediation) -> tuple[list[str], list[str]]:
        """Evicts every running pod of the job on the node; returns (evicted, refusals)."""
        import urllib3
        from kubernetes.client import V1DeleteOptions, V1Eviction, V1ObjectMeta
        from kubernetes.client.exceptions import ApiException

        evicted: list[str] = []
        refused: list[str] = []
        for namespace, name in self._job_pods(remediation):
            eviction = V1Eviction(
                api_version="policy/v1",
                kind="Eviction",
                metadata=V1ObjectMeta(name=name, namespace=namespace),
                delete_options=(
                    None
                    if self.grace_period_s is None
                    else V1DeleteOptions(grace_period_seconds=self.grace_period_s)
                ),
            )
            try:
                self.core.create_namespaced_pod_eviction(
                    name, namespace, eviction, _request_timeout=self.timeout_s
                )
            except ApiException as exc:
                if exc.status == 404:  # gone already: what the eviction wanted
                    evicted.append(f"{namespace}/{name} (already gone)")
                    continue
                budget = _budget_refusal(exc)
                if budget is not None:
                    refused.append(
                        f"eviction of {namespace}/{name} refused by a pod disruption budget (HTTP 429): {budget}"
                    )
                else:
                    refused.append(f"eviction of {namespace}/{name} failed: {api_error(exc)}")
                log.warning("could not evict %s/%s from node %s", namespace, name, remediation.node)
                continue
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                refused.append(f"eviction of {namespace}/{name} failed: API server unreachable: {exc}")
                break
            log.info("evicted %s/%s from node %s", namespace, name, remediation.node)
            evicted.append(f"{namespace}/{name}")
        return evicted, refused


def _controller(pod: V1Pod) -> str:
    """The pod's controlling owner (a Job, a ReplicaSet, ...) as "Kind/name"; "" for a bare pod."""
    for owner in (pod.metadata.owner_references if pod.metadata else None) or []:
        if owner.controller:
            return f"{owner.kind}/{owner.name}"
    return ""


def _taint_dict(taint: V1Taint) -> dict[str, Any]:
    """A taint as the API server wrote it: key, value, effect, timeAdded (kept, never reset)."""
    out: dict[str, Any] = {"key": taint.key, "effect": taint.effect}
    if taint.value is not None:
        out["value"] = taint.value
    if taint.time_added is not None:
        added = taint.time_added if taint.time_added.tzinfo else taint.time_added.replace(tzinfo=UTC)
        out["timeAdded"] = added.isoformat().replace("+00:00", "Z")  # RFC 3339, as metav1.Time writes it
    return out


def _status(exc: Any) -> dict[str, Any]:
    """The Status object the API server sends with an error, or {} when the body is not one."""
    try:
        body = json.loads(exc.body or "")
    except (TypeError, ValueError):
        return {}
    return body if isinstance(body, dict) else {}


def _status_message(exc: Any) -> str:
    return str(_status(exc).get("message") or exc.reason or "no message")


def _budget_refusal(exc: Any) -> str | None:
    """What a disruption budget said, when it refused an eviction (429 from the eviction subresource).

    A 429 from API priority and fairness (throttling) names no budget and gives None.
    """
    if exc.status != 429:
        return None
    causes = (_status(exc).get("details") or {}).get("causes") or []
    for cause in causes:
        if isinstance(cause, dict) and cause.get("reason") == "DisruptionBudget":
            return str(cause.get("message") or _status_message(exc))
    message = _status_message(exc)
    return message if "disruption budget" in message.lower() else None


def api_error(exc: Any) -> str:
    """One line for an ApiException: what the status means here, and the server's message."""
    status = exc.status
    meaning = {
        401: "unauthorized (check the credentials)",
        403: "forbidden (the service account lacks the RBAC permission)",
        404: "not found",
        409: "conflict (changed concurrently, retries exhausted)",
        429: "throttled by the API server",
    }.get(status, "request failed")
    return f"{meaning} (HTTP {status}): {_status_message(exc)}"
