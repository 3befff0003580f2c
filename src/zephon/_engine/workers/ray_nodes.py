"""Why a Ray attempt failed: its node was lost (free) or its actor crashed (one retry).

A micro-batch whose actor died, or whose result went with a node, runs again from its inputs.
Only crashes on nodes that stayed alive count against ``max_worker_retries``: a micro-batch
that kills its worker every time must fail, but one that was merely on a machine that vanished
must not, however many machines vanish while the cluster heals. The verdict on one failure:

* **lost**: Ray says the actor's node died (or was preempted), or the cluster's node table
  has that node dead;
* **crashed**: the node's raylet reported the worker process dead (so the node was alive), or
  the actor's creation failed;
* **not known yet**: Ray gave no cause, or a result was lost while its node still looks alive.
  Such a failure is settled later: lost once its node (or, when the node is unknown, any node
  that was alive when the attempt was sent) is dead; crashed once Ray's failure detection
  would have declared a vanished node dead (``detection_window_s``) and none was.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal, cast

Verdict = Literal["lost", "crashed"] | None

_NODE_ID = re.compile(r"Node Id: ([0-9a-f]+)")
_FALLBACK_WINDOW_S = 60.0


def detection_window_s(ray: Any) -> float:
    """How long Ray may take to declare a vanished node dead, from the cluster's health-check
    settings (which the driver receives when it connects)."""
    try:
        config = ray._raylet.Config
        ms = config.health_check_initial_delay_ms() + config.health_check_failure_threshold() * (
            config.health_check_period_ms() + config.health_check_timeout_ms()
        )
    except Exception:  # an older or newer Ray without these getters
        return _FALLBACK_WINDOW_S
    return max(float(ms) / 1000.0, 5.0)


@dataclass(frozen=True)
class Unsettled:
    """A failure whose cause Ray had not told yet."""

    node: str | None  # the actor's node, when it had said where it runs
    dead_when_sent: frozenset[str]  # nodes known dead when the attempt was sent
    deadline: float  # monotonic time after which it counts as a crash
    error: BaseException

    def verdict(self, dead: frozenset[str], now: float) -> Verdict:
        if self.node is not None and self.node in dead:
            return "lost"
        if self.node is None and dead - self.dead_when_sent:
            return "lost"
        return "crashed" if now >= self.deadline else None


class NodeWatch:
    """The cluster's dead nodes as this pool has seen them, and verdicts on failures."""

    def __init__(self, ray: Any) -> None:
        self._ray = ray
        self.dead: frozenset[str] = frozenset()  # replaced, never mutated: safe to read
        self.window_s = detection_window_s(ray)

    def refresh(self) -> frozenset[str]:
        """Read the node table (one call to Ray's control store)."""
        try:
            nodes = self._ray.nodes()
        except Exception:  # the control store is unreachable: keep what we knew
            return self.dead
        gone = {str(n["NodeID"]) for n in nodes if not n.get("Alive", True)}
        if not gone <= self.dead:
            self.dead = self.dead | gone
        return self.dead

    def mark(self, node: str) -> None:
        if node not in self.dead:
            self.dead = self.dead | {node}

    def judge(self, exc: BaseException, node: str | None) -> tuple[Verdict, str | None]:
        """The verdict on one failed attempt, and the node it ran on (``None``: unknown)."""
        errors = self._ray.exceptions
        text = str(exc)
        if node is None and (found := _NODE_ID.search(text)) is not None:
            node = found.group(1)
        actor = cast(Any, exc) if isinstance(exc, errors.RayActorError) else None
        if (
            isinstance(exc, errors.NodeDiedError)
            or "its node has died" in text
            or (actor is not None and bool(actor.preempted))
        ):
            return "lost", node
        if node is not None and node in self.refresh():
            return "lost", node
        if actor is not None and (
            bool(actor.actor_init_failed) or "worker process has died" in text
        ):
            return "crashed", node
        return None, node
