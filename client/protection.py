"""The generic training-loop hook: resume from the newest whole snapshot, agree at step boundaries
whether faultcast asked for a snapshot, take it on every rank at the same step, acknowledge it, and
hold still while the service drains the node and requeues the job.

    protection = protect("faultcast:50051", "/ckpt/my-job", model=model, optimizer=optimizer)
    for step in range(protection.resume(), total_steps):
        train_step(step)
        protection.step_end(step + 1)
    protection.close()

`step_end(n)` takes the number of steps completed. Every `agree_every` steps the ranks agree (one
all-reduce of two integers); every `checkpoint_every` steps (when set) a periodic checkpoint is
written in the background with `async_save`. Nothing here raises into training because the service
is away: without a connection there is simply nothing to snapshot for.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict, Unpack

import grpc
import torch
import torch.distributed as dist

from faultcast.actions import moves_node
from faultcast.client import identity, job_key, migration, peer_state, snapshot_reader, standby
from faultcast.client.agreement import Agreement, Vote
from faultcast.client.guard import Guard
from faultcast.client.replicas import DEFAULT_ROOT, BuddyReplicas
from faultcast.client.snapshots import Snapshot, SnapshotStore
from faultcast.client.train_state import StateDict, Stateful, TrainState
from faultcast.v1 import alerts_pb2 as apb

log = logging.getLogger(__name__)


@dataclass
class ProtectionStats:
    """What the hook did, for logs, tests and the overhead benchmark."""

    resumed_from: int | None = None
    snapshots: list[int] = field(default_factory=list)  # steps of predictive snapshots
    checkpoints: list[int] = field(default_factory=list)  # steps of finished periodic checkpoints
    acknowledgements: list[str] = field(default_factory=list)  # the service's replies
    alert_to_snapshot_s: list[float] = field(default_factory=list)  # guard ranks: alert seen -> save begins
    snapshot_started_unix: list[float] = field(default_factory=list)  # wall clock as each snapshot began
    held_s: float = 0.0
    warm_from: int | None = None  # a standby: the step of the snapshot it loaded while it waited
    standby_waited_s: float = 0.0  # a standby: from ready to the service's word
    handover_load_s: float = 0.0  # a standby: the hand-over snapshot's load, after the word
    handover_source: str = ""  # a standby: "peer" (the old job's memory) or "files" (the snapshot directory)
    handover_bytes: int = 0  # a standby: what it fetched from its peer
    # each alert snapshot's copy to host memory
    snapshot_blocking_s: list[float] = field(default_factory=list)
    protect_replicas: list[int] = field(default_factory=list)  # steps of replicas made for an open warning


@dataclass
class _AlertWrite:
    """An alert snapshot staged in host memory and being written: marked whole (rank 0) as soon as
    it is written, acknowledged at an agreement."""

    step: int
    alert: apb.Alert | None
    reason: str
    started_unix: float
    staged_unix: float
    written: Future[None]
    server: peer_state.PeerServer | None = None  # this rank's copy, served to a standby
    peers: list[peer_state.Peer | None] = field(default_factory=list)  # every rank's, gathered
    # Set once a scheduler's SIGTERM need not wait: this rank's copy went out, or no hand-over.
    release: threading.Event = field(default_factory=threading.Event)
    marked: Snapshot | None = None  # rank 0: the marker is down
    mark_lock: threading.Lock = field(default_factory=threading.Lock)


class ProtectionOptions(TypedDict, total=False):
    """Protection's optional keyword arguments, as protect() passes them on."""

    job_id: str | None
    node: str | None
    credentials: grpc.ChannelCredentials | None
    agree_every: int
    checkpoint_every: int
    keep: int
    migration_wait_s: float
    standby_for: str | None
    stands_by: bool
    replica_every: int
    replica_root: str | os.PathLike[str]
    racks: Mapping[str, str] | None
    on_failure: Callable[[apb.Alert], None] | None
    protect_replica_s: float


class Protection:
    """The training loop's hook (see the module's example): resume(), step_end(n) after every step,
    close() at the end. Every rank holds one and calls it at the same steps; only local rank 0 of each
    node talks to the service."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        state: TrainState,
        *,
        target: str | None = None,
        job_id: str | None = None,
        node: str | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        agree_every: int = 10,
        checkpoint_every: int = 0,
        keep: int = 2,
        migration_wait_s: float = 300.0,
        standby_for: str | None = None,
        stands_by: bool = False,
        replica_every: int = 0,
        replica_root: str | os.PathLike[str] = DEFAULT_ROOT,
        racks: Mapping[str, str] | None = None,
        on_failure: Callable[[apb.Alert], None] | None = None,
        protect_replica_s: float = 60.0,
        replace_node: bool = False,
    ) -> None:
        """`target`: the faultcast service (None: checkpoints only). `job_id` and `node` default to
        Slurm's SLURM_JOB_ID and SLURMD_NODENAME, then FAULTCAST_JOB_ID/torchrun's run id and the
        host name. `stands_by`: the service may ready a standby copy of this job on a spare during an
        alert (the scheduler runs the job's whole batch script or pod a second time: say so only when
        that is safe). `standby_for`: this run is the standby of that job (default:
        FAULTCAST_STANDBY_FOR, see faultcast.client.standby); `resume()` then waits for the
        hand-over. `replica_every`: every this many steps each rank's state is also copied to a buddy
        rank's node, in host memory under `replica_root` (faultcast.client.replicas; `racks` maps
        nodes to racks, so a copy goes to another rack); `resume()` then goes on from the newest whole
        replica when it is newer than the newest snapshot in the files. `on_failure`: called (on the
        guard's thread of local rank 0 of each node) with each FAILED event of any node of the job:
        a node of the job is gone and the collectives will not complete; ending the process there
        (`os._exit`) has torchrun restart the workers at once instead of after the collective's
        timeout. `protect_replica_s`: while an alert on the job's nodes asks for a snapshot (a
        warning of either tier), a replica is made at the first agreement step at least this long
        after the previous one, however far off `replica_every` is (the protect tier's price: a host
        copy a minute). `replace_node`: the job runs under torchrun's elastic rendezvous with a warm
        spare (faultcast.client.elastic) and buddy replicas: a snapshot-and-migrate alert then makes a
        replica at once instead of the whole job's move, acknowledged as the snapshot, and the warned
        node leaves the job as a lost node does (its torchrun agent ends with it); the others fail at
        their next collective, form the job again with the spare and go on from that replica, no
        step lost. Collective: every rank constructs it at the same point."""
        if agree_every < 1:
            raise ValueError("agree_every must be at least 1")
        if replace_node and not replica_every:
            raise ValueError(
                "replace_node needs buddy replicas (replica_every): the spare loads its part from them"
            )
        if replace_node and not os.environ.get("TORCHELASTIC_RUN_ID"):
            log.warning(
                "faultcast: replace_node without torchrun's elastic agent: a warned node's ranks would leave "
                "and nothing would take their place (see faultcast.client.elastic)"
            )
        standby_of = standby_for if standby_for is not None else standby.standby_for()
        if standby_of and target is None:
            raise ValueError(f"a standby for job {standby_of} needs the service (target) to hand over")
        self.state, self.agree_every, self.checkpoint_every = state, agree_every, checkpoint_every
        self.protect_replica_s = protect_replica_s
        self.replace_node = replace_node
        self.migration_wait_s = migration_wait_s
        self.store = SnapshotStore(directory, keep=keep)
        self.stats = ProtectionStats()
        distributed = dist.is_initialized()
        self.rank = dist.get_rank() if distributed else 0
        self.world_size = dist.get_world_size() if distributed else 1
        # Checkpoint I/O gets its own gloo group: async_save's background thread must not interleave
        # its collectives with the training loop's on the default group.
        self._io_group = dist.new_group(backend="gloo") if distributed else None
        self.agreement = Agreement()
        self.node = identity.node_name(node)
        nodes = identity.all_gather_strings(self.node)
        self.job_id = identity.job_id(job_id)
        # A standby that took over already (restarted by torchrun since) is an ordinary run now.
        took_over = bool(standby_of) and standby.took_over(self.store, self.job_id)
        self.standby_for = standby_of if standby_of and not took_over else None
        # Started again by the scheduler before it took over: it must not train beside the job.
        self._stood_down = (
            f"started again (restart {os.environ.get('SLURM_RESTART_COUNT')}) before it took job "
            f"{standby_of} over"
            if self.standby_for and standby.restarted()
            else ""
        )
        self.stands_by = stands_by or self.standby_for is not None
        self._guard_args = (target, credentials, sorted(set(nodes)))
        self.on_failure = on_failure
        self.guard: Guard | None = None
        # A standby neither registers nor subscribes until it takes over (its node is not the job's
        # yet); rank 0 asks the service for the hand-over on a channel of its own.
        self._asker: standby.HandOverAsker | None = None
        if self.standby_for and self.rank == 0 and target is not None:
            claim = standby.standby_claim()
            if not claim:
                log.warning(
                    "faultcast: standby for job %s has no %s in its environment: the service will refuse it",
                    self.standby_for,
                    standby.STANDBY_CLAIM,
                )
            self._asker = standby.HandOverAsker(
                target, credentials, self.job_id, self.node, standby.standby_alert(), claim
            )
        if not self.standby_for:
            self._start_guard()
        self._inflight: tuple[int, Future[None]] | None = None
        self._alert_write: _AlertWrite | None = None
        self._released = threading.Event()
        self._key: bytes | None = None  # the job's signing key, read (or created) when first needed
        self.replicas: BuddyReplicas | None = None
        if replica_every and self.world_size > 1 and not self.standby_for:
            self.replicas = BuddyReplicas(
                state,
                self._job_key(),
                every=replica_every,
                job_id=self.job_id,
                root=replica_root,
                node=self.node,
                racks=racks,
            )

    def _job_key(self) -> bytes:
        """The job's signing key, kept in its snapshot store (client/job_key.py)."""
        if self._key is None:
            self._key = job_key.job_key(self.store.root)
        return self._key

    def _start_guard(self) -> None:
        """The guard of local rank 0 on each node: registers the job, watches its node's alerts."""
        target, credentials, job_nodes = self._guard_args
        if target is not None and int(os.environ.get("LOCAL_RANK", "0")) == 0:
            self.guard = Guard(
                target,
                self.job_id,
                [self.node],
                credentials=credentials,
                job_nodes=job_nodes,
                stands_by=self.stands_by,
                on_failure=self.on_failure,
                replaces_nodes=self.replace_node,
            ).start()

    # -- the loop's calls -----------------------------------------------------------------------

    def resume(self) -> int:
        """Load the newest whole snapshot (or periodic checkpoint); returns the step to continue from
        (0 when there is none). Rank 0 chooses, so every rank loads the same one. A standby then
        waits for the service's hand-over and returns the hand-over snapshot's step, or raises
        StandbyReleased (exit status 75) when the service releases it."""
        chosen = [self.store.latest() if self.rank == 0 else None]
        if dist.is_initialized():
            dist.broadcast_object_list(chosen, src=0, group=self._io_group)
        if self._stood_down:
            raise standby.StandbyReleased(self._stood_down)
        if self.standby_for:
            return self._stand_by(chosen[0])
        if self.replicas is not None:
            newest = chosen[0].step if chosen[0] is not None else -1
            step = self.replicas.restore(newer_than=newest)
            if step is not None:
                self.stats.resumed_from = step
                return step
        return self._load(chosen[0])

    def _load(self, snapshot: Snapshot | None) -> int:
        """Load `snapshot` on every rank; the step to continue from (0 for None)."""
        if snapshot is None:
            return 0
        same_world = snapshot.world_size == self.world_size
        if not same_world:
            log.warning(
                "faultcast: snapshot %s was taken by %d ranks, this job has %d: model and optimizer "
                "restored, RNG and data position start afresh (the result will not be bit-identical)",
                snapshot.path,
                snapshot.world_size,
                self.world_size,
            )
        rank = self.rank if same_world else None
        loaded = self.state.to_load(rank)
        snapshot_reader.load(loaded, snapshot.path, self._io_group)
        step = self.state.restore(loaded, rank, self._job_key())
        self.stats.resumed_from = snapshot.step if step is None else step
        log.info("faultcast: resumed from %s (%s) at step %d", snapshot.path, snapshot.reason, snapshot.step)
        return self.stats.resumed_from

    def _stand_by(self, newest: Snapshot | None) -> int:
        """Warm up on the newest snapshot, then wait (rank 0 asks the service, every rank hears the
        answer at each poll) for the hand-over: load its snapshot, or end as released."""
        self.stats.warm_from = self._load(newest) if newest is not None else None
        ready = time.monotonic()
        assert self.standby_for is not None
        while True:
            word = [standby.ask(self._asker, self.standby_for, ready) if self.rank == 0 else None]
            if dist.is_initialized():
                dist.broadcast_object_list(word, src=0, group=self._io_group)
            decision = word[0]
            assert decision is not None
            if decision.go or decision.released:
                break
        self.stats.standby_waited_s = time.monotonic() - ready
        if self._asker is not None:
            self._asker.close()
            self._asker = None
        if decision.released:
            log.warning("faultcast: standby for job %s released: %s", self.standby_for, decision.reason)
            raise standby.StandbyReleased(decision.reason)
        started = time.monotonic()
        snapshot = self._handed_over_snapshot(decision)
        step = self._load_handed_over(snapshot)
        self.stats.handover_load_s = time.monotonic() - started
        if self.rank == 0:  # before the first step: a restart of this run must not stand by again
            standby.mark_taken_over(self.store, self.job_id, self.standby_for, step)
        self._start_guard()  # the job runs here now: register this node, watch its alerts
        log.warning(
            "faultcast: took over job %s from its snapshot of step %d (%s), %.2f s after the word",
            self.standby_for,
            step,
            decision.checkpoint_uri,
            self.stats.handover_load_s,
        )
        return step

    def _handed_over_snapshot(self, word: standby.Word) -> Snapshot:
        """The snapshot the word names, a whole one in this job's own store. When any rank refuses it
        (see standby.snapshot_at), every rank ends (HandOverRefused) without loading it or training.
        Collective."""
        snapshot: Snapshot | None = None
        refused = ""
        try:
            snapshot = standby.snapshot_at(self.store, word.checkpoint_uri, word.step)
        except standby.RefusedSnapshotError as exc:
            refused = str(exc)
        if self.agreement.agree(Vote(snapshot=bool(refused))).snapshot or snapshot is None:
            reason = refused or "another rank refused the snapshot the hand-over names"
            log.error(
                "faultcast: standby for job %s refuses the hand-over and ends without training: %s",
                self.standby_for,
                reason,
            )
            raise standby.HandOverRefused(reason)
        return snapshot

    def _load_handed_over(self, snapshot: Snapshot) -> int:
        """The hand-over snapshot: from the old job's memory when every rank can fetch its own part
        there (PEERS.json), else from the snapshot's files (collective: all ranks load alike)."""
        started = time.monotonic()
        peers = peer_state.read_peers(snapshot.path)
        fetched: StateDict | None = None
        if peers is not None and len(peers) == self.world_size:
            peer = peers[self.rank]
            try:
                like = self.state.to_load(self.rank)
                fetched = peer_state.fetch(peer.address, peer.token, peer.key, self.rank)
                if not peer_state.same_layout(fetched, like):
                    log.warning(
                        "faultcast: the state the peer sent is not this job's layout; loading the files"
                    )
                    fetched = None
            except Exception as exc:  # any failure here must reach the vote, not end this rank
                log.warning("faultcast: the snapshot's peer could not be read, loading its files: %s", exc)
                fetched = None
        if self.agreement.agree(Vote(snapshot=fetched is None)).snapshot or fetched is None:
            self.stats.handover_source = "files"
            return self._load(snapshot)
        step = self.state.restore(fetched, self.rank, self._job_key())
        self.stats.resumed_from = snapshot.step if step is None else step
        self.stats.handover_source, self.stats.handover_bytes = "peer", peer_state.nbytes(fetched)
        log.info(
            "faultcast: fetched the snapshot of step %d from its peer (%d bytes) in %.3f s",
            snapshot.step,
            self.stats.handover_bytes,
            time.monotonic() - started,
        )
        return self.stats.resumed_from

    def step_end(self, step: int) -> None:
        """Call after each optimizer step with the number of steps completed."""
        self._poll_inflight()
        if self.replicas is not None:
            self.replicas.step_end(step)
        if step % self.agree_every == 0:
            if self._alert_write is not None:  # an earlier alert's snapshot: written by now, mostly
                self._finish_alert_snapshot()
            alert = self.guard.pending() if self.guard is not None else None
            migrate = alert is not None and moves_node(alert.action)
            protect = (
                self.replicas is not None
                and self.guard is not None
                and self.guard.protecting()
                and self.replicas.since_last_s() >= self.protect_replica_s
            )
            vote = self.agreement.agree(Vote(snapshot=alert is not None, migrate=migrate, protect=protect))
            if vote.protect and self.replicas is not None:
                self.replicas.replicate(step)
                self.stats.protect_replicas.append(step)
            # A replica that did not reach every buddy whole: the files take the move instead.
            handed = vote.migrate and self.replace_node and self._hand_over_to_spare(step, alert, migrate)
            if handed:
                return
            if vote.snapshot:
                self._snapshot_for_alert(step, alert, migrate=vote.migrate)
                return
        if self.checkpoint_every and step % self.checkpoint_every == 0:
            self._start_checkpoint(step)

    def _hand_over_to_spare(self, step: int, alert: apb.Alert | None, warned_here: bool) -> bool:
        """Collective: replicate this step now, whole on every buddy before anyone goes on; the ranks
        of the warned node(s) acknowledge it and leave the job (`replace_node`). `warned_here`: this
        rank's guard has the snapshot-and-migrate alert. False, and nobody leaves, when the replica
        failed on some rank (host memory full, a buddy's part refused): the caller snapshots to
        files instead, so that the spare never goes on from an older replica."""
        if self.replicas is None:
            return False
        failures = self.replicas.stats.failed + self.replicas.stats.refused
        self.replicas.replicate(step)
        self.replicas.wait()
        whole = self.replicas.stats.failed + self.replicas.stats.refused == failures
        said = identity.all_gather_strings(f"{int(whole)} {self.node if warned_here else ''}")
        if not all(word.startswith("1") for word in said):
            log.warning(
                "faultcast: the replica of step %d is not whole on every rank; snapshotting to files", step
            )
            return False
        warned = {node for word in said if (node := word[2:])}
        self.stats.snapshots.append(step)
        if self.node not in warned:
            return (
                True  # go on: the next collective fails once the warned node has left, and torchrun restarts
            )
        if self.guard is not None and alert is not None:
            self.stats.acknowledgements.append(self.guard.snapshot_done(step, f"replica:{step}", alert))
        log.warning(
            "faultcast: node %s leaves the job after the replica of step %d (alert %s); a spare takes its part",
            self.node,
            step,
            alert.id if alert is not None else "?",
        )
        self.close()
        _leave_the_job()
        return True  # not reached: the process has left

    def close(self) -> None:
        """Finish a checkpoint under way and stop the guard."""
        self._released.set()
        if self._asker is not None:
            self._asker.close()
        self._wait_inflight()
        if self.replicas is not None:
            self.replicas.close()
        if self._alert_write is not None:
            self._finish_alert_snapshot(closing=True)
        if self.guard is not None:
            self.guard.close()

    def __enter__(self) -> Protection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- predictive snapshots -------------------------------------------------------------------

    def _snapshot_for_alert(self, step: int, alert: apb.Alert | None, *, migrate: bool) -> None:
        """Copy the state to host memory (all that blocks training) and write it in the background;
        rank 0 marks it whole as soon as it is written. A snapshot that only guards against the
        failure is acknowledged at the next agreement while training goes on; one before a migration
        now (the job stops anyway), and when a standby may take over, each rank also serves its copy
        to it."""
        self.stats.snapshot_started_unix.append(time.time())
        if alert is not None and self.guard is not None:
            self.stats.alert_to_snapshot_s.append(time.monotonic() - self.guard.pending_since)
        self._wait_inflight()
        reason = f"alert {alert.id} on {alert.node} gpu {alert.gpu}" if alert is not None else "alert"
        started = time.time()
        staged = peer_state.stage(self.state.to_save(step, self.rank, self._job_key()))
        staged_at = time.time()
        self.stats.snapshot_blocking_s.append(staged_at - started)
        release = threading.Event()
        server, peers = self._serve(staged, release) if migrate and self.stands_by else (None, [])
        written = self.store.write_staged(staged, step, self.rank, self._io_group)
        pending = _AlertWrite(step, alert, reason, started, staged_at, written, server, peers, release)
        if self.rank == 0:
            written.add_done_callback(lambda _: self._mark_whole(pending))
        self._alert_write = pending
        if migrate:
            self._finish_alert_snapshot()

    def _serve(
        self, staged: StateDict, served: threading.Event
    ) -> tuple[peer_state.PeerServer | None, list[peer_state.Peer | None]]:
        """Serve this rank's staged copy to a standby; every rank's peer, gathered (collective). A
        rank that cannot serve says None, and its standby reads the files."""
        try:
            server: peer_state.PeerServer | None = peer_state.PeerServer(staged, self.rank, served=served)
        except (peer_state.NotServableError, OSError) as exc:
            log.info("faultcast: this rank's snapshot is not served to a standby: %s", exc)
            server = None
        mine = peer_state.Peer.of(server) if server is not None else None
        everyone: list[peer_state.Peer | None] = [mine]
        if dist.is_initialized():
            everyone = [None] * self.world_size
            dist.all_gather_object(everyone, mine, group=self._io_group)
        return server, everyone

    def _mark_whole(self, pending: _AlertWrite) -> Snapshot | None:
        """Rank 0, once the write is done (on the writer's thread, or at the agreement, whichever
        comes first): the peers, then the marker. None when the write or the marker failed."""
        with pending.mark_lock:
            if pending.marked is not None or pending.written.exception() is not None:
                return pending.marked
            path = self.store.path(pending.step)
            served = [p for p in pending.peers if p is not None]
            try:
                if served and len(served) == len(pending.peers):
                    try:
                        peer_state.write_peers(path, served)
                    except OSError as exc:  # the standby then reads the files
                        log.warning("faultcast: could not record where the snapshot is served: %s", exc)
                pending.marked = self.store.finish(
                    pending.step,
                    self.rank,
                    pending.reason,
                    self.world_size,
                    started_unix=pending.started_unix,
                    staged_unix=pending.staged_unix,
                )
            except OSError:
                log.exception(
                    "faultcast: the alert snapshot of step %d could not be marked whole", pending.step
                )
            return pending.marked

    def _finish_alert_snapshot(self, *, closing: bool = False) -> None:
        """Once the alert snapshot is whole: acknowledge it, and hold if the service moves the job.
        Collective (an agreement tells every rank whether every part is whole), except when
        `closing`: the job ends, a rank other than 0 acknowledges only once it sees the marker."""
        pending, self._alert_write = self._alert_write, None
        assert pending is not None
        try:
            self._acknowledge_alert_snapshot(pending, closing)
        finally:  # acknowledged, refused, held or handed over: this rank's copy is served no longer
            pending.release.set()
            if pending.server is not None:
                pending.server.close()

    def _acknowledge_alert_snapshot(self, pending: _AlertWrite, closing: bool) -> None:
        """_finish_alert_snapshot's work, its server closed by the caller whatever happens here."""
        step = pending.step
        try:
            pending.written.result()
            whole_here = self._mark_whole(pending) is not None if self.rank == 0 else True
        except Exception:  # never acknowledged: the alert stays pending and is snapshotted again
            log.exception("faultcast: the alert snapshot of step %d could not be written", step)
            whole_here = False
        if closing:
            whole = whole_here and (self.rank == 0 or self.store.wait_whole(step, peer_state.SERVE_S))
        else:
            whole = not self.agreement.agree(Vote(snapshot=not whole_here)).snapshot
        if not whole:
            return
        self.stats.snapshots.append(step)
        uri = self.store.path(step).resolve().as_uri()
        deferred = (
            peer_state.termination_deferred(pending.release) if pending.server is not None else nullcontext()
        )
        with deferred:  # a scheduler ending the job as soon as it hears of the snapshot waits for the copy
            expect_migration = False
            if self.guard is not None and pending.alert is not None:
                expect_migration = migration.acknowledge(
                    self.guard, step, uri, self.stats.acknowledgements, taken_for=pending.alert
                )
            if not closing and self.agreement.agree(Vote(migrate=expect_migration)).migrate:
                self._hold_for_migration(step, pending)

    def _hold_for_migration(self, step: int, pending: _AlertWrite) -> None:
        """Hold while the job is moved. Handed over to a standby, a rank serving it its copy lets the
        scheduler's SIGTERM wait until the copy went out; and a job the scheduler did not end stops
        here rather than train beside the standby."""
        # Every node's guard heard the reply for its own node's alert: any one of them decides.
        reply = self.stats.acknowledgements[-1] if self.stats.acknowledgements else ""
        handed = self.agreement.agree(Vote(migrate=migration.handed_over(reply))).migrate
        if not handed or pending.server is None:
            pending.release.set()  # a requeue: nothing to wait for
        self._hold(step)
        if handed:
            pending.release.wait(peer_state.SERVE_S)
            log.error(
                "faultcast: the job was handed over to a standby at step %d and this copy was not ended; "
                "it stops here rather than train beside the standby",
                step,
            )
            raise standby.HandedOver(step)

    def _hold(self, step: int) -> None:
        """Hold while the job is moved; if nothing comes within `migration_wait_s`, go on."""
        start = time.monotonic()
        migration.hold(self._released, step, self.migration_wait_s)
        if dist.is_initialized():
            dist.barrier(group=self._io_group)
        self.stats.held_s += time.monotonic() - start
        log.warning("faultcast: no migration came within %.0f s; training goes on", self.migration_wait_s)

    # -- periodic checkpoints -------------------------------------------------------------------

    def _start_checkpoint(self, step: int) -> None:
        if self._alert_write is not None:
            return  # an alert snapshot newer than this checkpoint is being written
        self._wait_inflight()
        state = self.state.to_save(step, self.rank, self._job_key())
        future = self.store.save(state, step, self.rank, self._io_group, wait=not dist.is_initialized())
        if future is None:
            self._finish_checkpoint(step)
        else:
            self._inflight = (step, future)

    def _poll_inflight(self) -> None:
        if self._inflight is not None and self._inflight[1].done():
            self._wait_inflight()

    def _wait_inflight(self) -> None:
        if self._inflight is None:
            return
        step, future = self._inflight
        self._inflight = None
        try:
            future.result()
        except Exception:  # a failed periodic checkpoint is reported, never fatal to training
            log.exception("faultcast: periodic checkpoint of step %d failed; it is not used", step)
            return
        self._finish_checkpoint(step)

    def _finish_checkpoint(self, step: int) -> None:
        self.store.finish(step, self.rank, "periodic", self.world_size)
        self.stats.checkpoints.append(step)


def _leave_the_job() -> None:
    """End this rank's process, and with local rank 0 its node's torchrun agent: the rendezvous then
    drops the node when its heartbeat stops, as for a node lost (an agent that ended cleanly would
    close the rendezvous for everyone; one whose workers just exited would wait at its exit barrier
    while still counted)."""
    if os.environ.get("TORCHELASTIC_RUN_ID") and int(os.environ.get("LOCAL_RANK", "0")) == 0:
        os.kill(os.getppid(), signal.SIGKILL)
    logging.shutdown()
    os._exit(0)


def protect(
    target: str | None,
    directory: str | os.PathLike[str],
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Stateful | None = None,
    data: Stateful | None = None,
    **options: Unpack[ProtectionOptions],
) -> Protection:
    """The one-line setup: `Protection` over a `TrainState` of these parts; `options` are Protection's
    other keyword arguments (ProtectionOptions)."""
    state = TrainState(model=model, optimizer=optimizer, scheduler=scheduler, data=data)
    return Protection(Path(directory), state, target=target, **options)


def latest_snapshot(directory: str | os.PathLike[str]) -> Snapshot | None:
    """The newest whole snapshot in `directory` (None when there is none); no service, no collective."""
    return SnapshotStore(directory).latest()
