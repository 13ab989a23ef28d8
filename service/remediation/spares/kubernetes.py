"""Spares on Kubernetes: a standby copy of the warned job's pod, created before anything is drained.

`prepare` finds the job's pods by the actuator's label selector (`faultcast.io/job=<job id>` by
default) and creates a standby pod beside them: a copy of the job's pod on the doomed node (its
containers, images, commands, resources, volumes, service account, tolerations, scheduler) with
- FAULTCAST_STANDBY_FOR=<job id> in every container: the job's trainer (`faultcast.client.Protection`)
  loads the newest periodic checkpoint and waits for the service's hand-over instead of training;
- FAULTCAST_JOB_ID=<the standby pod's name>: the standby's own job id, so that its registration does
  not overwrite the old job's nodes; after the hand-over the job carries on under that id, and the pod
  carries the selector's labels with it, so a later alert on its node finds it; it is the only job id
  the service hands the job over to;
- FAULTCAST_STANDBY_CLAIM=<the spare's claim>: the secret the standby proves itself with (whoever may
  read pods in the namespace may read it, as they may read the job's own environment);
- a required node affinity that keeps it off the doomed node (kubernetes.io/hostname NotIn [node], and
  the node's name itself, metadata.name NotIn [node], for clusters whose hostname label differs),
  added to each of the pod's own node selector terms;
- labels faultcast.io/standby-for=<job id> and faultcast.io/alert=<alert id>; no nodeName, no owner,
  restartPolicy Never.

The scheduler places the pod during the alert's lead, and the kubelet of the node it is bound to pulls
the image before starting the container: the pull is part of scheduling the pod, done by the time the
standby waits. A pod that finds no room stays Pending; no standby calls, and at the snapshot the spare
is released (the pod deleted) and the job is requeued as it would be without spares.

The pod's name comes from the job and the alert, so a repeated `prepare` finds its pod there (409
AlreadyExists counts as done once the pod's labels show it is that standby). `release` deletes it (404
counts as done). The handle is "namespace/name".

Which jobs get a standby: a job that runs as one pod, for a copy of one pod is the whole job only
then (a copy of one pod of several would join, or wait for, the others' rendezvous). And a pod run by
a controller (a Job, a JobSet, a PyTorchJob) gets none unless `allow_owned`: the hand-over deletes the
old pod (service/remediation/kubernetes.py), and most controllers start a deleted pod again, beside the standby.
`allow_owned` is for controllers that do not (a Job with backoffLimit 0, or a podFailurePolicy that
fails the Job). After the hand-over the job runs on as the standby, a bare pod: nothing starts it
again if it fails, or if a later alert on its node finds no standby ready and evicts it (its
snapshots stay, to resubmit from).

Not copied: the job's labels, annotations and owner (a controller whose selector matched would adopt
the standby), nodeName, a kubernetes.io/hostname node selector naming the doomed node, hostname and
subdomain (the old pod's DNS name), ephemeral containers, and priority, preemptionPolicy and overhead
(the API server fills them in from priorityClassName and runtimeClassName, which are kept). The copy
mounts the same volumes: the checkpoint directory must be on storage a second node can mount while
the first still does (ReadWriteMany), since the standby loads the snapshots from there.

What the service account needs: list on pods (in the configured namespace, or cluster-wide), get,
create and delete on pods.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import re
from typing import TYPE_CHECKING, Any

from faultcast.service.remediation.actuators import Outcome
from faultcast.service.remediation.kubernetes import (
    DEFAULT_JOB_SELECTOR,
    api_error,
    client_from_kubeconfig,
    client_in_cluster,
    is_label_value,
)
from faultcast.service.remediation.spares.prescheduler import (
    JOB_ID_ENV,
    STANDBY_ALERT,
    STANDBY_CLAIM,
    STANDBY_FOR,
    Prepared,
    SpareRequest,
)

if TYPE_CHECKING:
    from kubernetes.client import ApiClient, CoreV1Api

log = logging.getLogger(__name__)

Json = dict[str, Any]

STANDBY_FOR_LABEL = "faultcast.io/standby-for"
ALERT_LABEL = "faultcast.io/alert"
HOSTNAME_LABEL = "kubernetes.io/hostname"
MAX_NAME = 63  # the standby's name is also a label value (its job id) and its host name
# The old pod's own: where it runs, its DNS name, what may not be set on create, and what admission
# computes from priorityClassName and runtimeClassName (set and different, it refuses the pod).
_NOT_COPIED = (
    "nodeName",
    "hostname",
    "subdomain",
    "ephemeralContainers",
    "priority",
    "preemptionPolicy",
    "overhead",
)


class _NoStandbyError(Exception):
    """The job gets no standby here; the message says why."""


class KubernetesSpares:
    """Standby pods on Kubernetes (see the module's docstring). `api`, `job_selector` and `namespace`
    as for the Kubernetes actuator (the same values find the same pods); `allow_owned`: ready spares
    for pods a controller runs too."""

    name = "kubernetes"

    def __init__(
        self,
        api: ApiClient | CoreV1Api,
        *,
        job_selector: str = DEFAULT_JOB_SELECTOR,
        namespace: str | None = None,
        allow_owned: bool = False,
        timeout_s: float = 10.0,
    ) -> None:
        from kubernetes.client import CoreV1Api

        if "{job_id}" not in job_selector:
            raise ValueError(f"the job selector needs a {{job_id}} placeholder: {job_selector!r}")
        if timeout_s <= 0:
            raise ValueError("Kubernetes spares need a positive timeout")
        self.core = api if isinstance(api, CoreV1Api) else CoreV1Api(api)
        self.job_selector, self.namespace, self.allow_owned = job_selector, namespace, allow_owned
        self.timeout_s = timeout_s

    @classmethod
    def from_kubeconfig(
        cls, path: str | None = None, context: str | None = None, **options: Any
    ) -> KubernetesSpares:
        """Builds the client from a kubeconfig file (default: $KUBECONFIG or ~/.kube/config)."""
        return cls(client_from_kubeconfig(path, context), **options)

    @classmethod
    def in_cluster(cls, **options: Any) -> KubernetesSpares:
        """Builds the client from the pod's service account."""
        return cls(client_in_cluster(), **options)

    def prepare(self, request: SpareRequest) -> Prepared:
        """Create the standby pod; the handle is its "namespace/name"."""
        import urllib3
        from kubernetes.client.exceptions import ApiException

        try:
            old = self._pod_to_copy(request)
            namespace, name = old["metadata"].get("namespace") or "default", standby_name(request)
            pod = standby_pod(old, request, name, self._labels(request, name))
            created = self._create(namespace, pod, request)
        except _NoStandbyError as exc:
            return Prepared(False, "", f"kubernetes: {exc}: no standby")
        except ApiException as exc:
            return Prepared(False, "", f"kubernetes: standby for job {request.job_id}: {api_error(exc)}")
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            return Prepared(
                False, "", f"kubernetes: standby for job {request.job_id}: API server unreachable: {exc}"
            )
        where = f"{namespace}/{name}"
        log.info(
            "standby pod %s (%s) for job %s, away from node %s", where, created, request.job_id, request.node
        )
        return Prepared(
            True,
            where,
            f"kubernetes: standby pod {where} for job {request.job_id} ({created}, a copy of "
            f"{namespace}/{old['metadata'].get('name')}), not on {request.node}; the node it is "
            "scheduled to pulls its image before it starts",
            standby_job=name,  # its FAULTCAST_JOB_ID
        )

    def release(self, request: SpareRequest, handle: str, why: str) -> Outcome:
        """Delete the standby pod (pending or waiting); one already gone counts as released."""
        import urllib3
        from kubernetes.client.exceptions import ApiException

        namespace, _, name = handle.rpartition("/")
        if not namespace or not name:
            return Outcome(
                False, f"kubernetes: {handle!r} names no standby pod (namespace/name), deleted nothing"
            )
        try:
            self.core.delete_namespaced_pod(name, namespace, _request_timeout=self.timeout_s)
        except ApiException as exc:
            if exc.status != 404:
                return Outcome(False, f"kubernetes: deleting standby pod {handle} failed: {api_error(exc)}")
            return Outcome(True, f"kubernetes: standby pod {handle} was gone already ({why})")
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            return Outcome(False, f"kubernetes: deleting standby pod {handle}: API server unreachable: {exc}")
        log.info("deleted standby pod %s of job %s (%s)", handle, request.job_id, why)
        return Outcome(True, f"kubernetes: deleted standby pod {handle} ({why})")

    def _pod_to_copy(self, request: SpareRequest) -> Json:
        """The job's one pod, on the doomed node; _NoStandbyError when the job is not that."""
        job, node = request.job_id, request.node
        if not is_label_value(job):
            raise _NoStandbyError(f"job id {job!r} is not a valid label value")
        selector = self.job_selector.replace("{job_id}", job)
        pods = self._list(selector)
        here = [p for p in pods if (p.get("spec") or {}).get("nodeName") == node]
        names = ", ".join(_where(p) for p in pods)
        if not here:
            found = f"its pods are elsewhere ({names})" if pods else f"no running pod matches {selector}"
            raise _NoStandbyError(f"job {job} has no running pod on node {node}: {found}")
        if len(pods) > 1:
            raise _NoStandbyError(
                f"job {job} runs as {len(pods)} pods ({names}): a copy of one is not the job "
                "(standby pods are for jobs of one pod)"
            )
        owner = controller(here[0])
        if owner and not self.allow_owned:
            raise _NoStandbyError(
                f"pod {_where(here[0])} of job {job} is run by {owner}, which would start it again "
                "when the hand-over deletes it, beside the standby (allow_owned where it would not)"
            )
        return here[0]

    def _list(self, selector: str) -> list[Json]:
        """The running or pending pods `selector` finds, as JSON (camelCase, as the API server writes
        them): the copy is made on that, and sent as that."""
        if self.namespace is None:
            pods = self.core.list_pod_for_all_namespaces(
                label_selector=selector, _request_timeout=self.timeout_s
            )
        else:
            pods = self.core.list_namespaced_pod(
                self.namespace, label_selector=selector, _request_timeout=self.timeout_s
            )
        serialize = self.core.api_client.sanitize_for_serialization
        return [
            serialize(pod)
            for pod in pods.items or []
            if pod.metadata is not None
            and pod.metadata.deletion_timestamp is None  # terminating already
            and (pod.status is None or pod.status.phase not in ("Succeeded", "Failed"))
        ]

    def _labels(self, request: SpareRequest, name: str) -> dict[str, str]:
        """Ours, and the job selector's equality terms with the standby's own job id, so that the
        actuator's selector finds the pod once it carries the job on."""
        labels = {STANDBY_FOR_LABEL: request.job_id, ALERT_LABEL: str(request.alert_id)}
        for term in self.job_selector.split(","):
            if "!=" in term or "=" not in term:
                continue  # not a label the pod can carry (an inequality, a set)
            key, value = (part.strip() for part in term.replace("==", "=").split("=", 1))
            labels.setdefault(key, value.replace("{job_id}", name))
        return labels

    def _create(self, namespace: str, pod: Json, request: SpareRequest) -> str:
        """Create the pod ("created"); "there already" when a repeated prepare made it before."""
        from kubernetes.client.exceptions import ApiException

        name = pod["metadata"]["name"]
        try:
            # A dict: pydantic clients validate it into a V1Pod, older ones send it as it is.
            self.core.create_namespaced_pod(namespace, pod, _request_timeout=self.timeout_s)  # type: ignore[arg-type]
        except ApiException as exc:
            if exc.status != 409:
                raise
            # The name is the job's and the alert's: a pod of that name is ours unless its labels say not.
            there = self.core.read_namespaced_pod(name, namespace, _request_timeout=self.timeout_s)
            labels = (there.metadata.labels if there.metadata else None) or {}
            if (labels.get(STANDBY_FOR_LABEL), labels.get(ALERT_LABEL)) != (
                request.job_id,
                str(request.alert_id),
            ):
                raise _NoStandbyError(
                    f"pod {namespace}/{name} exists and is not the standby of job {request.job_id} "
                    f"for alert {request.alert_id}"
                ) from exc
            return "there already"
        return "created"


def standby_name(request: SpareRequest) -> str:
    """The standby pod's name: from the job id and the alert, a DNS label of at most 63 characters
    (and so a label value); a job id that had to change to fit gets a digest of itself, so that two
    job ids never share a name."""
    suffix = f"-standby-{request.alert_id}"
    base = re.sub(r"[^a-z0-9]+", "-", request.job_id.lower()).strip("-")
    tag = ""
    if base != request.job_id or len(base) + len(suffix) > MAX_NAME:
        tag = "-" + hashlib.sha256(request.job_id.encode()).hexdigest()[:8]
    base = base[: MAX_NAME - len(suffix) - len(tag)].rstrip("-") or "job"
    return base + tag + suffix


def standby_pod(old: Json, request: SpareRequest, name: str, labels: dict[str, str]) -> Json:
    """The standby: `old`'s spec with the changes the module's docstring lists."""
    spec: Json = copy.deepcopy(old.get("spec") or {})
    for key in _NOT_COPIED:
        spec.pop(key, None)
    spec["restartPolicy"] = "Never"
    selector = spec.get("nodeSelector") or {}
    if selector.get(HOSTNAME_LABEL) == request.node:  # pinned to the doomed node: the copy must not be
        del selector[HOSTNAME_LABEL]
    if not selector:
        spec.pop("nodeSelector", None)
    _keep_off(spec, request.node)
    ours = {
        STANDBY_FOR: request.job_id,
        STANDBY_ALERT: str(request.alert_id),
        JOB_ID_ENV: name,
        STANDBY_CLAIM: request.claim,
    }
    for container in spec.get("containers") or []:
        kept = [e for e in container.get("env") or [] if e.get("name") not in ours]
        container["env"] = kept + [{"name": key, "value": value} for key, value in ours.items()]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": old["metadata"].get("namespace"), "labels": labels},
        "spec": spec,
    }


def _keep_off(spec: Json, node: str) -> None:
    """Add "not on `node`" to every required node selector term (terms are alternatives: each needs
    it), making one when the pod has none."""
    affinity = spec["affinity"] = spec.get("affinity") or {}
    node_affinity = affinity["nodeAffinity"] = affinity.get("nodeAffinity") or {}
    key = "requiredDuringSchedulingIgnoredDuringExecution"
    required = node_affinity[key] = node_affinity.get(key) or {}
    terms = required["nodeSelectorTerms"] = required.get("nodeSelectorTerms") or [{}]
    for term in terms:
        term["matchExpressions"] = [
            *(term.get("matchExpressions") or []),
            {"key": HOSTNAME_LABEL, "operator": "NotIn", "values": [node]},
        ]
        term["matchFields"] = [
            *(term.get("matchFields") or []),
            {"key": "metadata.name", "operator": "NotIn", "values": [node]},
        ]


def controller(pod: Json) -> str:
    """The pod's controlling owner as "Kind/name"; "" for a bare pod."""
    for owner in pod["metadata"].get("ownerReferences") or []:
        if owner.get("controller"):
            return f"{owner.get('kind')}/{owner.get('name')}"
    return ""


def _where(pod: Json) -> str:
    meta = pod["metadata"]
    return f"{meta.get('namespace')}/{meta.get('name')} on {(pod.get('spec') or {}).get('nodeName') or 'no node'}"
