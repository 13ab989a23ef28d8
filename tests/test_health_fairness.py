"""Health Watch slots are shared fairly: health needs no identity, so callers without one
could take every slot; now they share a capped part of them (and each host a part of that), while a
caller that presents an identity the service knows watches in slots kept for identified callers."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from faultcast.service.rpc.limits import CallerLimits, WatchSlots
from tests.attacks.tokened import tokened_service

WAIT_S = 30.0  # detects a hang; an answered Watch takes milliseconds
SERVING = health_pb2.HealthCheckResponse.SERVING
LIMITS = CallerLimits(
    health_watches=6, anonymous_health_watches=3, health_watches_per_host=5, health_watches_per_caller=2
)


async def _served(stubs: list[health_pb2_grpc.HealthStub]) -> list[Any]:
    """One Watch per stub, each open and answered with its first status (grpc_health is untyped)."""
    watches = [stub.Watch(health_pb2.HealthCheckRequest(), timeout=WAIT_S) for stub in stubs]
    first = await asyncio.wait_for(asyncio.gather(*(w.read() for w in watches)), WAIT_S)
    assert [f.status for f in first] == [SERVING] * len(watches)
    return watches  # kept open by the caller


async def _refused(stub: health_pb2_grpc.HealthStub) -> str:
    """A Watch that must be refused: its message."""
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.Watch(health_pb2.HealthCheckRequest(), timeout=WAIT_S).read()
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    return str(refused.value.details())


def test_anonymous_watches_past_their_share_are_refused_and_identified_callers_still_watch(
    stub_model: Path, tmp_path: Path
) -> None:
    with tokened_service(stub_model, tmp_path, caller_limits=LIMITS) as tokened:

        async def scenario() -> list[str]:
            async with (
                tokened.aio_channel() as stranger,
                tokened.aio_channel("nobody") as unknown,  # a token the service does not know
                tokened.aio_channel("job-a") as trainer,
                tokened.aio_channel("alice") as admin,
            ):
                anonymous = health_pb2_grpc.HealthStub(stranger)
                mine = health_pb2_grpc.HealthStub(trainer)
                theirs = health_pb2_grpc.HealthStub(admin)
                kept = await _served([anonymous] * LIMITS.anonymous_health_watches)
                refusals = [await _refused(anonymous), await _refused(health_pb2_grpc.HealthStub(unknown))]
                kept += await _served([mine] * LIMITS.health_watches_per_caller)
                refusals.append(await _refused(mine))  # the trainer's own cap
                kept += await _served([theirs] * (LIMITS.health_watches - len(kept)))
                refusals.append(await _refused(theirs))  # every slot taken now
                for watch in kept:
                    watch.cancel()
                return refusals

        anonymous, unknown, trainer, full = asyncio.run(scenario())
        assert "without an identity" in anonymous
        assert "without an identity" in unknown
        assert "trainer/job-a" in trainer
        assert f"{LIMITS.health_watches} streams" in full
        assert tokened.throttled("health_watches") == 4


def test_watch_slots_cap_each_anonymous_host_their_share_and_each_identity() -> None:
    slots = WatchSlots(total=6, anonymous=3, per_host=2, per_identity=2)
    assert [slots.enter(None, "host-a") for _ in range(2)] == ["", ""]
    assert "host-a" in slots.enter(None, "host-a")  # its host's cap
    assert slots.enter(None, "host-b") == ""
    assert "without an identity" in slots.enter(None, "host-c")  # the anonymous share is full
    assert [slots.enter("trainer/job-a", "host-a") for _ in range(2)] == ["", ""]
    assert "trainer/job-a" in slots.enter("trainer/job-a", "host-a")
    assert slots.enter("admin/alice", "host-c") == ""
    assert "6 streams" in slots.enter("admin/bob", "host-c")  # every slot taken
    assert slots.open == 6
    slots.leave(None, "host-a")
    assert slots.enter(None, "host-c") == ""  # a slot of the anonymous share came free
    slots.leave("trainer/job-a", "host-a")
    assert slots.enter("admin/bob", "host-c") == ""
    assert slots.open == 6
