"""Verdicts on failed Ray attempts: node losses are free, crashes on live nodes count, and
what Ray leaves unexplained is settled from the node table (Ray's own exception objects, as
its core worker builds them, and the node table of a real local cluster)."""

from __future__ import annotations

from typing import Any

import pytest

from zephon._engine.workers.ray_nodes import NodeWatch, Unsettled, detection_window_s

DEAD = "ab" * 28  # a node id as Ray writes them (56 hex digits)


def died(message: str, *, preempted: bool = False) -> BaseException:
    from ray.core.generated import common_pb2
    from ray.exceptions import ActorDiedError, NodeDeathInfo

    ctx = common_pb2.ActorDiedErrorContext(
        error_message=message, class_name="OpActor", actor_id=b"\x01" * 16
    )
    if preempted:
        ctx.node_death_info.reason = NodeDeathInfo.AUTOSCALER_DRAIN_PREEMPTED
    return ActorDiedError(ctx)


def test_ray_saying_the_node_died_is_a_loss_and_names_the_node(ray_session: Any) -> None:
    watch = NodeWatch(ray_session)
    exc = died(f"The actor died because its node has died. Node Id: {DEAD}")
    assert watch.judge(exc, None) == ("lost", DEAD)
    assert watch.judge(died("drained", preempted=True), "cd" * 28) == ("lost", "cd" * 28)


def test_a_worker_death_reported_by_a_live_node_is_a_crash(ray_session: Any) -> None:
    watch = NodeWatch(ray_session)
    here = ray_session.get_runtime_context().get_node_id()
    exc = died("The actor is dead because its worker process has died. Worker exit type: ...")
    assert watch.judge(exc, here) == ("crashed", here)
    assert here not in watch.dead  # the node table was read: this node is alive


def test_what_ray_leaves_unexplained_waits_for_the_node_table(ray_session: Any) -> None:
    from ray.exceptions import ActorUnavailableError, ObjectLostError

    watch = NodeWatch(ray_session)
    here = ray_session.get_runtime_context().get_node_id()
    unavailable = ActorUnavailableError("connection lost", b"\x02" * 16)
    assert watch.judge(unavailable, here) == (None, here)
    lost_object = ObjectLostError("00" * 28, None, "")
    assert watch.judge(lost_object, None) == (None, None)
    watch.mark(DEAD)  # once the table has the node dead, any failure there is a loss
    assert watch.judge(unavailable, DEAD) == ("lost", DEAD)


@pytest.mark.parametrize(
    ("node", "dead_now", "now", "expected"),
    [
        ("n1", {"n1"}, 0.0, "lost"),  # its node is dead
        ("n1", {"n2"}, 0.0, None),  # another node died: not this one's cause
        ("n1", {"n2"}, 10.0, "crashed"),  # past the window, its node still alive
        (None, {"n0", "n2"}, 0.0, "lost"),  # unknown node: a node died since it was sent
        (None, {"n0"}, 0.0, None),  # ... and none did
        (None, {"n0"}, 10.0, "crashed"),
    ],
)
def test_unsettled_failures_settle_by_node_table_then_by_time(node, dead_now, now, expected):
    failure = Unsettled(node, frozenset({"n0"}), deadline=10.0, error=RuntimeError("x"))
    assert failure.verdict(frozenset(dead_now), now) == expected


def test_the_verdict_window_follows_the_clusters_health_checks(ray_session: Any) -> None:
    # Ray's defaults: 5 s initial delay + 5 x (3 s period + 10 s timeout)
    assert detection_window_s(ray_session) == pytest.approx(70.0)
