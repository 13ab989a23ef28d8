"""Spares on Kubernetes (service/remediation/spares/kubernetes.py) and the actuator's end of a hand-over
(service/remediation/kubernetes.py), through the real client against the fake API server (tests/k8s_fake.py);
then the whole round with the service's Prescheduler: a standby readied at the alert, told to go on
at the snapshot, the old pod deleted; and a false alarm that deletes the standby."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes.client import ApiClient, Configuration

from faultcast.service.metrics import ServiceMetrics
from faultcast.service.remediation.actuators import Remediation
from faultcast.service.remediation.kubernetes import KubernetesActuator
from faultcast.service.remediation.spares.kubernetes import (
    ALERT_LABEL,
    STANDBY_FOR_LABEL,
    KubernetesSpares,
    standby_name,
)
from faultcast.service.remediation.spares.prescheduler import Prescheduler, SpareRequest
from faultcast.testing.system import refused_port
from faultcast.v1 import alerts_pb2 as apb
from tests.k8s_fake import FakeApiServer, Json, node, pod

WAIT_S = 30.0
CHECKPOINT = "file:///ckpt/step-900"
NOT_ON_NODE_1 = [
    {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["node-1"]},
]
NAME_NOT_NODE_1 = [{"key": "metadata.name", "operator": "NotIn", "values": ["node-1"]}]


def trainer(namespace: str, name: str, node_name: str, job: str, **extra: Any) -> Json:
    """A training pod as a cluster runs one: pinned to its node, with GPUs, a checkpoint volume, a
    priority class, a DNS name, and its job id in its environment from its label."""
    obj = pod(namespace, name, node_name, {"faultcast.io/job": job, "app": "trainer"})
    obj["spec"] = {
        "nodeName": node_name,
        "hostname": name,
        "subdomain": "trainers",
        "priorityClassName": "training",
        "priority": 1000,
        "preemptionPolicy": "PreemptLowerPriority",
        "serviceAccountName": "trainer",
        "restartPolicy": "OnFailure",
        "nodeSelector": {"nvidia.com/gpu.product": "H100", "kubernetes.io/hostname": node_name},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [
            {
                "name": "trainer",
                "image": "registry.example/trainer:7",
                "command": ["torchrun", "--nproc-per-node=8", "train.py"],
                "env": [
                    {
                        "name": "FAULTCAST_JOB_ID",
                        "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['faultcast.io/job']"}},
                    },
                    {"name": "EPOCHS", "value": "3"},
                ],
                "resources": {
                    "limits": {"nvidia.com/gpu": "8", "memory": "512Gi"},
                    "requests": {"cpu": "32"},
                },
                "volumeMounts": [{"name": "ckpt", "mountPath": "/ckpt"}],
            }
        ],
        "volumes": [{"name": "ckpt", "persistentVolumeClaim": {"claimName": "ckpt-rwx"}}],
        **extra,
    }
    return obj


def owned_by(obj: Json, kind: str, name: str) -> Json:
    obj["metadata"]["ownerReferences"] = [
        {"apiVersion": "batch/v1", "kind": kind, "name": name, "uid": "u-1", "controller": True}
    ]
    return obj


@pytest.fixture
def server() -> Iterator[FakeApiServer]:
    fake = FakeApiServer()
    for name in ("node-1", "node-2", "node-3"):
        fake.add_node(node(name))
    fake.add_pod(trainer("train", "a-0", "node-1", "job-a"))  # a one-pod job on the doomed node
    fake.add_pod(trainer("train", "m-0", "node-1", "job-m"))  # a job of two pods
    fake.add_pod(trainer("train", "m-1", "node-2", "job-m"))
    fake.add_pod(owned_by(trainer("train", "o-0", "node-1", "job-o"), "Job", "job-o"))
    fake.add_pod(trainer("train", "b-0", "node-2", "job-b"))  # elsewhere
    fake.start()
    yield fake
    fake.stop()


@pytest.fixture
def api(server: FakeApiServer) -> Iterator[ApiClient]:
    with ApiClient(Configuration(host=server.url)) as client:
        yield client


def ask(job: str = "job-a", node: str = "node-1", alert_id: int = 42) -> SpareRequest:
    return SpareRequest(
        alert_id=alert_id, job_id=job, node=node, gpu=3, mode="hbm_wear", risk=0.91, claim=f"claim-{alert_id}"
    )


def env_of(obj: Json) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in obj["spec"]["containers"][0]["env"]}


def standby_in(server: FakeApiServer, handle: str) -> Json:
    namespace, name = handle.split("/")
    return server.pods[(namespace, name)]


# -- prepare ---------------------------------------------------------------------------------------


def test_the_standby_is_the_jobs_pod_copied_away_from_the_node(server: FakeApiServer, api: ApiClient) -> None:
    old = trainer("train", "a-0", "node-1", "job-a")

    prepared = KubernetesSpares(api).prepare(ask())

    assert prepared.ok, prepared.detail
    namespace, name = prepared.handle.split("/")
    assert (namespace, name) == ("train", standby_name(ask()))
    assert prepared.standby_job == name  # the job id its trainer runs under, named by the service
    assert name in prepared.detail
    assert "pulls its image" in prepared.detail
    standby = standby_in(server, prepared.handle)
    spec, was = standby["spec"], old["spec"]
    assert standby["metadata"]["labels"] == {
        STANDBY_FOR_LABEL: "job-a",
        ALERT_LABEL: "42",
        "faultcast.io/job": name,  # its own job id: the actuator's selector finds it once it is the job
    }
    assert "ownerReferences" not in standby["metadata"]
    for key in ("nodeName", "hostname", "subdomain", "priority", "preemptionPolicy"):
        assert key not in spec, key
    assert spec["restartPolicy"] == "Never"
    # What the job needs to run comes along unchanged.
    container, had = spec["containers"][0], was["containers"][0]
    for key in ("name", "image", "command", "resources", "volumeMounts"):
        assert container[key] == had[key], key
    for key in ("volumes", "tolerations", "serviceAccountName", "priorityClassName"):
        assert spec[key] == was[key], key
    assert spec["nodeSelector"] == {"nvidia.com/gpu.product": "H100"}  # not pinned to the doomed node
    assert spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == {
        "nodeSelectorTerms": [{"matchExpressions": NOT_ON_NODE_1, "matchFields": NAME_NOT_NODE_1}]
    }
    assert env_of(standby) == {
        "EPOCHS": "3",
        "FAULTCAST_STANDBY_FOR": "job-a",
        "FAULTCAST_STANDBY_ALERT": "42",
        "FAULTCAST_JOB_ID": name,  # in place of the job's own (from its label): not the old job's id
        "FAULTCAST_STANDBY_CLAIM": "claim-42",  # the secret it proves itself with
    }
    assert server.pods[("train", "a-0")]["spec"] == was  # the job's pod is left as it was
    (create,) = server.seen("POST")
    assert create.path == "/api/v1/namespaces/train/pods"
    (listing,) = server.seen("GET", "/api/v1/pods")
    assert listing.query["labelSelector"] == ["faultcast.io/job=job-a"]


def test_every_required_node_selector_term_keeps_the_standby_off_the_node(
    server: FakeApiServer, api: ApiClient
) -> None:
    zone_a = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}
    zone_b = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["b"]}
    preferred = [{"weight": 1, "preference": {"matchExpressions": [zone_a]}}]
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [zone_a]}, {"matchExpressions": [zone_b]}]
            },
            "preferredDuringSchedulingIgnoredDuringExecution": preferred,
        }
    }
    server.add_pod(trainer("train", "z-0", "node-3", "job-z", affinity=affinity))

    prepared = KubernetesSpares(api).prepare(ask("job-z", "node-3"))

    assert prepared.ok, prepared.detail
    node_affinity = standby_in(server, prepared.handle)["spec"]["affinity"]["nodeAffinity"]
    not_here = {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["node-3"]}
    name_not_here = {"key": "metadata.name", "operator": "NotIn", "values": ["node-3"]}
    # The terms are alternatives: one without the exclusion would let the pod onto the node.
    assert node_affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"] == [
        {"matchExpressions": [zone_a, not_here], "matchFields": [name_not_here]},
        {"matchExpressions": [zone_b, not_here], "matchFields": [name_not_here]},
    ]
    assert node_affinity["preferredDuringSchedulingIgnoredDuringExecution"] == preferred


def test_a_repeated_prepare_finds_its_standby_there(server: FakeApiServer, api: ApiClient) -> None:
    spares = KubernetesSpares(api)

    first, again = spares.prepare(ask()), spares.prepare(ask())

    assert first.ok, first.detail
    assert again.ok, again.detail
    assert again.handle == first.handle
    assert "there already" in again.detail
    assert len(server.seen("POST")) == 2  # the second answered 409 AlreadyExists
    assert [key for key in server.pods if key[1].startswith("job-a-standby")] == [
        ("train", standby_name(ask()))
    ]


def test_a_pod_of_the_standbys_name_that_is_not_the_standby_is_not_taken_for_it(
    server: FakeApiServer, api: ApiClient
) -> None:
    server.add_pod(pod("train", standby_name(ask()), "node-3", {"app": "something-else"}))

    prepared = KubernetesSpares(api).prepare(ask())

    assert not prepared.ok
    assert "is not the standby of job job-a" in prepared.detail


@pytest.mark.parametrize(
    ("job", "says"),
    [
        (
            "job-b",
            "job job-b has no running pod on node node-1: its pods are elsewhere (train/b-0 on node-2)",
        ),
        ("job-gone", "no running pod matches faultcast.io/job=job-gone"),
        ("job-m", "job job-m runs as 2 pods"),
        ("job-o", "is run by Job/job-o"),
        ("job a/b", "is not a valid label value"),
    ],
)
def test_a_job_that_a_pod_copy_cannot_carry_on_gets_no_standby(
    server: FakeApiServer, api: ApiClient, job: str, says: str
) -> None:
    prepared = KubernetesSpares(api).prepare(ask(job))

    assert not prepared.ok
    assert says in prepared.detail
    assert prepared.detail.endswith("no standby")
    assert not server.seen("POST")


def test_a_pod_run_by_a_controller_gets_a_standby_where_allowed(
    server: FakeApiServer, api: ApiClient
) -> None:
    prepared = KubernetesSpares(api, allow_owned=True).prepare(ask("job-o"))

    assert prepared.ok, prepared.detail
    assert "ownerReferences" not in standby_in(server, prepared.handle)["metadata"]


def test_the_namespace_and_selector_are_the_actuators(server: FakeApiServer, api: ApiClient) -> None:
    server.add_pod(trainer("eval", "a-eval", "node-3", "job-a"))
    spares = KubernetesSpares(api, namespace="eval", job_selector="app=trainer,faultcast.io/job={job_id}")

    prepared = spares.prepare(ask(node="node-3"))

    assert prepared.ok, prepared.detail
    assert prepared.handle == f"eval/{standby_name(ask())}"
    assert [r.path for r in server.seen("GET")] == ["/api/v1/namespaces/eval/pods"]
    labels = standby_in(server, prepared.handle)["metadata"]["labels"]
    assert labels["app"] == "trainer"
    assert labels["faultcast.io/job"] == standby_name(ask())


@pytest.mark.parametrize(
    "job", ["job-a", "Job_A", "slurm.12345", "x" * 80, "-_-", "1234", "a" * 63 + "b", "a" * 63 + "c"]
)
def test_standby_names_are_dns_labels(job: str) -> None:
    name = standby_name(ask(job, alert_id=987654321))

    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", name), name
    assert name.endswith("-standby-987654321")


def test_distinct_jobs_get_distinct_standby_names() -> None:
    jobs = ["job-a", "Job-A", "job_a", "job.a", "a" * 63 + "b", "a" * 63 + "c", "-_-", "_-_"]

    names = {standby_name(ask(job)) for job in jobs}

    assert len(names) == len(jobs)
    assert standby_name(ask("job-a")) == "job-a-standby-42"  # kept readable where it fits


# -- release ---------------------------------------------------------------------------------------


def test_release_deletes_the_standby_and_one_gone_counts_as_released(
    server: FakeApiServer, api: ApiClient
) -> None:
    spares = KubernetesSpares(api)
    prepared = spares.prepare(ask())
    namespace, name = prepared.handle.split("/")

    released = spares.release(ask(), prepared.handle, "the alert cleared")
    again = spares.release(ask(), prepared.handle, "the alert cleared")

    assert released.ok, released.detail
    assert "the alert cleared" in released.detail
    assert (namespace, name) not in server.pods
    assert ("train", "a-0") in server.pods
    assert again.ok, again.detail
    assert "gone already" in again.detail
    assert [r.path for r in server.seen("DELETE")] == [f"/api/v1/namespaces/{namespace}/pods/{name}"] * 2


def test_api_refusals_are_results_not_exceptions(server: FakeApiServer, api: ApiClient) -> None:
    spares = KubernetesSpares(api)
    handle = spares.prepare(ask()).handle
    server.forbidden.update({"POST", "DELETE"})

    prepared = spares.prepare(ask(alert_id=43))
    released = spares.release(ask(), handle, "false alarm")
    nameless = spares.release(ask(), "no-namespace", "false alarm")

    assert not prepared.ok
    assert "403" in prepared.detail
    assert not released.ok
    assert "403" in released.detail
    assert standby_in(server, handle)  # still there
    assert not nameless.ok
    assert "names no standby pod" in nameless.detail


def test_an_unreachable_api_server_is_reported_not_raised() -> None:
    with refused_port() as port, ApiClient(Configuration(host=f"http://127.0.0.1:{port}")) as client:
        spares = KubernetesSpares(client, timeout_s=2.0)
        prepared = spares.prepare(ask())
        released = spares.release(ask(), "train/job-a-standby-42", "false alarm")

    assert not prepared.ok
    assert "unreachable" in prepared.detail
    assert not released.ok
    assert "unreachable" in released.detail


@pytest.mark.parametrize("options", [{"job_selector": "faultcast.io/job=job-a"}, {"timeout_s": 0.0}])
def test_bad_settings_are_refused(api: ApiClient, options: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"."):
        KubernetesSpares(api, **options)


# -- the actuator's end of a hand-over ---------------------------------------------------------------


def handed_over(job: str = "job-a", standby: str = "job-a-standby-42") -> Remediation:
    return Remediation(
        alert_id=42,
        node="node-1",
        gpu=3,
        mode="hbm_wear",
        risk=0.91,
        job_id=job,
        requeue=False,
        checkpoint_uri=CHECKPOINT,
        handover_to=standby,
    )


def test_a_handed_over_job_is_deleted_not_evicted(server: FakeApiServer, api: ApiClient) -> None:
    server.budget_blocked.add(("train", "a-0"))  # a disruption budget would hold it up

    outcome = KubernetesActuator(api).remediate(handed_over())

    assert outcome.ok, outcome.detail
    assert ("train", "a-0") not in server.pods
    assert [r.path for r in server.seen("DELETE")] == ["/api/v1/namespaces/train/pods/a-0"]
    assert not server.seen("POST")  # no eviction
    assert "handed over to standby job-a-standby-42" in outcome.detail
    assert "train/a-0" in outcome.detail
    assert server.nodes["node-1"]["spec"]["unschedulable"] is True
    assert {("train", "m-0"), ("train", "o-0"), ("train", "b-0")} <= set(server.pods)


def test_a_deleted_pod_with_a_controller_is_named(server: FakeApiServer, api: ApiClient) -> None:
    outcome = KubernetesActuator(api).remediate(handed_over("job-o"))

    assert outcome.ok, outcome.detail
    assert "train/o-0 (run by Job/job-o: it may start the pod again)" in outcome.detail


def test_a_refused_deletion_is_an_outcome_not_ok(server: FakeApiServer, api: ApiClient) -> None:
    server.forbidden.add("DELETE")

    outcome = KubernetesActuator(api).remediate(handed_over())

    assert not outcome.ok
    assert "deleting train/a-0 failed" in outcome.detail
    assert "403" in outcome.detail
    assert ("train", "a-0") in server.pods


# -- with the service's Prescheduler ---------------------------------------------------------------


def alert(state: apb.AlertState.ValueType, **fields: Any) -> apb.Alert:
    return apb.Alert(
        id=42,
        opened_id=42,
        node="node-1",
        gpu=3,
        mode=apb.FAILURE_MODE_HBM_WEAR,
        risk=0.91,
        state=state,
        **fields,
    )


def until(what: str, predicate: Callable[[], bool]) -> None:
    """Poll `predicate` (another thread makes it true) until it holds; fail after WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)  # polling another thread's progress, bounded by the deadline


@pytest.fixture
def prescheduler(api: ApiClient) -> Iterator[Prescheduler]:
    spares = Prescheduler(KubernetesSpares(api), lambda: {"job-a": ["node-1"]}, ServiceMetrics())
    spares.note_job("job-a", stands_by=True)  # its trainer registered as able to stand by
    spares.start()
    yield spares
    spares.stop()


def test_the_standby_takes_over_at_the_snapshot_and_the_old_pod_goes(
    server: FakeApiServer, api: ApiClient, prescheduler: Prescheduler
) -> None:
    prescheduler.on_alerts([alert(apb.ALERT_STATE_OPEN)])
    prescheduler.drain_calls()
    spare = prescheduler.spare_of("job-a")
    assert spare is not None
    assert spare.handle, spare.detail
    standby = standby_in(server, spare.handle)
    standby_job = env_of(standby)["FAULTCAST_JOB_ID"]  # who the standby's trainer says it is
    standby["spec"]["nodeName"] = "node-2"  # the scheduler binds it, away from node-1
    replies: list[Any] = []
    waiter = threading.Thread(
        target=lambda: replies.append(
            prescheduler.await_hand_over(
                "job-a", standby_job, "node-2", WAIT_S, claim=env_of(standby)["FAULTCAST_STANDBY_CLAIM"]
            )
        )
    )
    waiter.start()
    until("the standby to wait", lambda: spare.waiting > 0)

    taken = prescheduler.hand_over("job-a", 42, 900, CHECKPOINT)
    waiter.join(WAIT_S)
    assert taken is not None
    outcome = KubernetesActuator(api).remediate(handed_over(standby=taken.standby_job))

    assert [(r.state, r.step, r.checkpoint_uri) for r in replies] == [
        (apb.HAND_OVER_STATE_GO, 900, CHECKPOINT)
    ]
    assert outcome.ok, outcome.detail
    assert f"handed over to standby {standby_job}" in outcome.detail
    assert ("train", "a-0") not in server.pods
    assert standby_in(server, spare.handle) is standby  # the standby trains on
    # It is the job now, under its own id: a later alert on its node finds its pod.
    later = Remediation(42 + 1, "node-2", 0, "hbm_wear", 0.9, job_id=standby_job, requeue=True)
    assert KubernetesActuator(api).remediate(later).ok
    assert [r.path for r in server.seen("POST", "/api/v1/namespaces/train/pods/")] == [
        f"/api/v1/namespaces/train/pods/{standby_job}/eviction"
    ]


def test_a_false_alarm_deletes_the_standby(server: FakeApiServer, prescheduler: Prescheduler) -> None:
    prescheduler.on_alerts([alert(apb.ALERT_STATE_OPEN)])
    prescheduler.drain_calls()
    spare = prescheduler.spare_of("job-a")
    assert spare is not None
    assert standby_in(server, spare.handle)

    prescheduler.on_alerts([alert(apb.ALERT_STATE_CLEARED, clear_reason=apb.CLEAR_REASON_RISK_FELL)])
    prescheduler.drain_calls()

    namespace, name = spare.handle.split("/")
    assert (namespace, name) not in server.pods
    assert ("train", "a-0") in server.pods
    assert [r.path for r in server.seen("DELETE")] == [f"/api/v1/namespaces/{namespace}/pods/{name}"]
