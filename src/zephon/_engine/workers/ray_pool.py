"""Ray actors as a worker pool: ``runner="ray"`` or operators added with ``placement="remote"``.

Each operator gets a group of ``parallelism`` actors, each holding its own copy of the operator
(shipped with cloudpickle, ``setup`` run inside the actor). The pool has the same shape as the
thread and process pools (``submit(elems) -> Future``), so the engine's driver thread keeps
the accumulator, bounds what is in flight and releases results by sequence number: the output
is identical to the inline runner whatever the cluster does. A micro-batch goes to the least
loaded actor on a node that is still alive (each actor reports its node first). When an actor
dies (its process killed, its node lost), or a result is lost with the node that held it, the
actor is replaced and the micro-batch is sent again from its inputs (which the driver keeps
until the result arrives; Ray's object reconstruction is never relied on). Only crashes on
nodes that stayed alive count against ``max_retries``; a node loss costs nothing, however
many nodes go while the cluster heals (see ``ray_nodes`` for how a failure is judged).

Nothing about checkpoints lives in the actors: they are stateless workers, and the checkpoint
is taken from the driver process that iterates the pipeline. That is also why they can be kept:
when an iteration ends its actors (operator set up, tokenizer loaded) wait idle, and the next
iteration of the same operator in the same Ray session takes them over. ``release_actors``
tears the idle ones down; the least recently used groups go when too many wait.

Actors ask for no CPU; ``resources`` (from ``placement="remote", resources={...}``) is passed
to Ray as is, so a custom resource a node was started with (``ray start --resources``) pins a
stage to the nodes that carry it.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any, assert_never

import cloudpickle

from zephon._engine.handoff.messages import Failed, Ok, RunReply
from zephon._engine.handoff.shm import resolve_items
from zephon._engine.state.stage import annotate, call_process_many
from zephon._engine.workers.joins import CLOSE_WAIT_S
from zephon._engine.workers.pools import WorkerCrashedError, WorkerPool
from zephon._engine.workers.ray_nodes import NodeWatch, Unsettled, Verdict
from zephon._exit import at_exit
from zephon.ops import BaseOp, OpContext
from zephon.types import StreamItem

log = logging.getLogger("zephon")


def import_ray() -> Any:
    from zephon._optional import require

    return require("ray", "runner='ray' and placement='remote'")


class OpActor:
    """One worker copy of an operator inside a Ray actor (set up lazily, on the first batch)."""

    def __init__(self, blob: bytes, ctx: OpContext, worker_index: int) -> None:
        self._blob = blob
        self._ctx = replace(ctx, worker_index=worker_index)
        self._op: BaseOp | None = None

    def pid(self) -> int:
        return os.getpid()

    def node_id(self) -> str:
        import ray

        return str(ray.get_runtime_context().get_node_id())

    def run(self, elems: list[StreamItem]) -> RunReply:
        op = self._op
        try:
            if op is None:
                op = cloudpickle.loads(self._blob)
                assert isinstance(op, BaseOp)
                op.setup(self._ctx)
                self._op = op
            return Ok(call_process_many(op, elems))
        except BaseException as exc:
            return Failed(annotate(exc, self._ctx.op_name))

    def teardown(self) -> None:
        if self._op is not None:
            self._op.teardown()
            self._op = None


# Idle actor groups by (session, operator name, identity of operator + context + resources).
_IDLE: OrderedDict[tuple[str, str, str], list[Any]] = OrderedDict()
_IDLE_LOCK = threading.Lock()
_MAX_IDLE_GROUPS = 8


def _session(ray: Any) -> str:
    """Names this Ray session: handles from an earlier cluster must never be reused."""
    node = getattr(getattr(ray, "_private", None), "worker", None)
    node = getattr(getattr(node, "global_worker", None), "node", None)
    name = getattr(node, "session_name", None)
    return str(name or ray.get_runtime_context().gcs_address)


def _take_idle(key: tuple[str, str, str], count: int) -> list[Any]:
    with _IDLE_LOCK:
        actors = _IDLE.pop(key, [])
    return actors[:count] + [None] * (count - len(actors[:count]))


def _retire(actors: list[Any], ray: Any) -> None:
    """Tear operator copies down (10 s at most) and let the actors exit."""
    with contextlib.suppress(Exception):
        ray.get([a.teardown.remote() for a in actors], timeout=10)
    for actor in actors:
        with contextlib.suppress(Exception):
            actor.__ray_terminate__.remote()  # exits once its queue is empty


def _keep_idle(key: tuple[str, str, str], actors: list[Any], ray: Any) -> None:
    with _IDLE_LOCK:
        evicted = _IDLE.pop(key, [])  # a second pool of the same operator closed first
        _IDLE[key] = actors
        while len(_IDLE) > _MAX_IDLE_GROUPS:
            evicted += _IDLE.popitem(last=False)[1]
    _retire(evicted, ray)


def idle_actors() -> dict[str, list[Any]]:
    """Actor handles waiting for the next iteration, by operator name (for diagnostics)."""
    out: dict[str, list[Any]] = {}
    with _IDLE_LOCK:
        for (_, name, _), actors in _IDLE.items():
            out.setdefault(name, []).extend(actors)
    return out


def release_actors() -> None:
    """Tear down and stop every idle actor of this process (also done at interpreter exit)."""
    with _IDLE_LOCK:
        groups = list(_IDLE.values())
        _IDLE.clear()
    if not groups:
        return
    ray = import_ray()
    if ray.is_initialized():
        _retire([a for g in groups for a in g], ray)


at_exit(release_actors)


@dataclass(eq=False)
class _Member:
    """One actor of a slot, and the node it runs on once it has said so (its first call)."""

    actor: Any
    probe: Any  # the ObjectRef of actor.node_id()
    node: str | None = None


@dataclass(eq=False)
class _Job:
    elems: list[StreamItem]
    future: Future[list[StreamItem]]
    crashes: int = 0  # crashes on nodes that stayed alive; node losses cost nothing
    unsettled: list[Unsettled] = field(default_factory=list)
    dead_when_sent: frozenset[str] = frozenset()
    parked: bool = False  # over its budget unless an unsettled failure was a node loss


class RayWorkerPool(WorkerPool):
    """``parallelism`` Ray actors running one operator; see the module docstring.

    Results are collected by one thread of ours that sweeps the pending object refs with
    ``ray.wait``: no code of ours runs on Ray's own threads (Ray calls made from there, or
    while they wait for the GIL, can deadlock), and every Ray call comes from our threads.
    """

    def __init__(
        self, op: BaseOp, parallelism: int, ctx: OpContext, *, max_retries: int = 3
    ) -> None:
        ray = import_ray()
        if not ray.is_initialized():
            ray.init()  # a local cluster, or the one RAY_ADDRESS names
        self._ray = ray
        self._name = op.name
        self._ctx = ctx
        self._max_retries = max_retries
        # Actors take no CPU reservation: parallelism is the user's call, as with processes.
        self._resources = dict(ctx.services.get("ray_resources", {}))
        self._cls = ray.remote(num_cpus=0, max_restarts=0, max_task_retries=0)(OpActor)
        blob = cloudpickle.dumps(op)
        identity = hashlib.sha256(blob + cloudpickle.dumps((ctx, sorted(self._resources.items()))))
        self._key = (_session(ray), op.name, identity.hexdigest())
        self._blob = ray.put(blob)
        self._lock = threading.Lock()
        self._closed = False
        self.replaced = 0
        self.node_losses: set[str] = set()  # ids of the nodes lost while this pool ran
        self._nodes = NodeWatch(ray)
        self._probes: dict[Any, _Member] = {}
        self._suspects: list[_Job] = []  # jobs with a failure not settled yet
        self._next_settle = 0.0
        kept = _take_idle(self._key, parallelism)
        self._slots = [self._member(slot, actor) for slot, actor in enumerate(kept)]
        self._load = [0] * parallelism
        self._pending: dict[Any, tuple[_Job, int, _Member]] = {}
        self._wake = threading.Event()
        self._collector = threading.Thread(
            target=self._collect, name=f"zephon-engine-ray-{op.name}", daemon=True
        )
        self._collector.start()

    def _member(self, slot: int, actor: Any = None) -> _Member:
        """A slot's actor (a new one unless given) and the probe asking for its node."""
        if actor is None:
            options: dict[str, Any] = {"scheduling_strategy": "SPREAD"}
            if self._resources:
                options["resources"] = self._resources
            actor = self._cls.options(**options).remote(self._blob, self._ctx, slot)
        member = _Member(actor, actor.node_id.remote())
        self._probes[member.probe] = member
        return member

    def _replace(self, slot: int, member: _Member) -> None:
        """Under the lock: ``member`` is gone; its slot gets a new actor (once)."""
        if self._slots[slot] is member:
            self._slots[slot] = self._member(slot)
            self.replaced += 1

    def pids(self) -> list[int]:
        """Process ids of the actors (starts them if needed; for tests and diagnostics)."""
        with self._lock:
            actors = [m.actor for m in self._slots]
        return [int(p) for p in self._ray.get([a.pid.remote() for a in actors])]

    def busy_nodes(self) -> dict[str, int]:
        """Micro-batches in flight per node (on actors that said where they run)."""
        counts: dict[str, int] = {}
        with self._lock:
            for _, _, member in self._pending.values():
                if member.node is not None:
                    counts[member.node] = counts.get(member.node, 0) + 1
        return counts

    def submit(self, elems: list[StreamItem]) -> Future[list[StreamItem]]:
        future: Future[list[StreamItem]] = Future()
        future.set_running_or_notify_cancel()
        try:
            resolve_items(elems)  # shared-memory handles do not travel between machines
            self._send(_Job(elems, future))
        except BaseException as exc:
            future.set_exception(annotate(exc, self._name))
        return future

    def _send(self, job: _Job) -> None:
        """To the least loaded actor known to run on a live node (any actor while none is:
        at the start, or until a lost node's replacements have started)."""
        with self._lock:
            dead = self._nodes.dead
            slots = self._slots
            live = [i for i, m in enumerate(slots) if m.node is not None and m.node not in dead]
            slot = min(live or range(len(slots)), key=self._load.__getitem__)
            self._load[slot] += 1
            member = slots[slot]
            job.dead_when_sent = dead
            ref = member.actor.run.remote(job.elems)
            self._pending[ref] = (job, slot, member)
        self._wake.set()

    def _collect(self) -> None:
        ray = self._ray
        while not self._closed:
            with self._lock:
                refs = [*self._pending, *self._probes]
            if self._suspects and time.monotonic() >= self._next_settle:
                self._guard(self._settle)
            if not refs:
                self._wake.wait(timeout=0.25 if self._suspects else 0.5)
                self._wake.clear()
                continue
            try:
                ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0.01, fetch_local=True)
            except BaseException:
                ready = []
            for ref in ready:
                self._guard(lambda ref=ref: self._ready(ref))
        self._fail_leftovers()

    def _guard(self, step: Any) -> None:
        """Run one collector step; a bug in it must not end the collector (futures would hang)."""
        try:
            step()
        except BaseException:
            log.exception("zephon: operator %r: the Ray result collector failed a step", self._name)

    def _ready(self, ref: Any) -> None:
        with self._lock:
            member = self._probes.pop(ref, None)
            entry = None if member is not None else self._pending.pop(ref)
            if entry is not None:
                self._load[entry[1]] -= 1
        if member is not None:
            self._probed(member)
            return
        assert entry is not None
        job, slot, member = entry
        try:
            self._done(job, slot, member, ref)
        except BaseException as exc:  # never leave a future hanging
            if not job.future.done():
                job.future.set_exception(annotate(exc, self._name))

    def _probed(self, member: _Member) -> None:
        """An actor said where it runs, or died first (replaced now if its node was lost)."""
        try:
            member.node = str(self._ray.get(member.probe))
        except BaseException as exc:
            verdict, node = self._nodes.judge(exc, None)
            if verdict == "lost":
                self._node_lost(node, member)
            return
        if member.node in self._nodes.dead:
            self._node_lost(member.node, member)

    def _done(self, job: _Job, slot: int, member: _Member, ref: Any) -> None:
        errors = self._ray.exceptions
        try:
            reply: RunReply = self._ray.get(ref)
        except (errors.RayActorError, errors.ObjectLostError, errors.NodeDiedError) as exc:
            # The actor died, or the result lived on a node that is gone (ObjectLostError and
            # its kind): never rely on Ray rebuilding it; run the micro-batch again from its
            # inputs, which the driver still holds.
            self._failed(job, slot, member, exc)
            return
        match reply:
            case Ok():
                job.future.set_result(reply.out)
            case Failed():
                job.future.set_exception(reply.error)
            case _:
                assert_never(reply)

    def _failed(self, job: _Job, slot: int, member: _Member, exc: BaseException) -> None:
        """One attempt of ``job`` failed on ``member``: free again if the node was lost, one
        crash if the actor died on a live node, settled later if Ray has not said which."""
        if member.node is None:
            with contextlib.suppress(BaseException):  # answered, not swept yet (or never)
                member.node = str(self._ray.get(member.probe, timeout=0))
        verdict, node = self._nodes.judge(exc, member.node)
        if verdict == "lost":
            self._node_lost(node, member, slot)
            log.warning(
                "zephon: operator %r: Ray actor %d's node %s was lost (%s); running the "
                "micro-batch again from its inputs on a live actor (a node loss costs no retry)",
                self._name, slot, node or "(unknown)", type(exc).__name__,
            )  # fmt: skip
            self._send(job)
            return
        with self._lock:
            self._replace(slot, member)
        if verdict == "crashed":
            job.crashes += 1
        else:
            deadline = time.monotonic() + self._nodes.window_s
            job.unsettled.append(Unsettled(node, job.dead_when_sent, deadline, exc))
            if job not in self._suspects:
                self._suspects.append(job)
        self._retry(job, slot, exc, verdict)

    def _node_lost(self, node: str | None, member: _Member, slot: int | None = None) -> None:
        """``node`` is gone: every actor on it (and ``member``) gets a replacement."""
        if node is not None:
            self._nodes.mark(node)
            self.node_losses.add(node)
        with self._lock:
            for i, m in enumerate(self._slots):
                if m is member or (node is not None and m.node == node):
                    self._replace(i, m)

    def _retry(self, job: _Job, slot: int, exc: BaseException, verdict: Verdict) -> None:
        if job.crashes > self._max_retries:
            self._give_up(job, exc)
            return
        if job.crashes + len(job.unsettled) > self._max_retries:
            job.parked = True  # sent again only if an unsettled failure was a node loss
            return
        log.warning(
            "zephon: operator %r: a micro-batch on Ray actor %d failed (%s%s); replaced the "
            "actor and retrying the micro-batch from its inputs (attempt %d of %d)",
            self._name, slot, type(exc).__name__,
            "; its node stayed alive" if verdict else "; node loss or crash, not known yet",
            job.crashes + len(job.unsettled) + 1, self._max_retries + 1,
        )  # fmt: skip
        self._send(job)

    def _settle(self) -> None:
        """Judge the failures Ray had not explained, from a fresh read of the node table."""
        self._next_settle = time.monotonic() + 0.25
        dead, now = self._nodes.refresh(), time.monotonic()
        with self._lock:
            stale = [(i, m) for i, m in enumerate(self._slots) if m.node in dead]
        for i, m in stale:
            self._node_lost(m.node, m, i)
        for job in list(self._suspects):
            still, lost = [], []
            for failure in job.unsettled:
                verdict = failure.verdict(dead, now)
                if verdict == "lost":
                    lost.append(failure)
                    if failure.node is not None:
                        self.node_losses.add(failure.node)
                if verdict == "crashed":
                    job.crashes += 1
                elif verdict is None:
                    still.append(failure)
            job.unsettled = still
            if job.future.done() or not (job.unsettled or job.parked):
                self._suspects.remove(job)
            elif job.parked and job.crashes > self._max_retries:
                self._suspects.remove(job)
                self._give_up(job, job.unsettled[-1].error if job.unsettled else None)
            elif job.parked and job.crashes + len(job.unsettled) <= self._max_retries:
                job.parked = False
                for failure in lost:
                    log.warning(
                        "zephon: operator %r: a held-back micro-batch's node %s was lost (%s); "
                        "running the micro-batch again from its inputs (a node loss costs no "
                        "retry)", self._name, failure.node or "(unknown)",
                        type(failure.error).__name__,
                    )  # fmt: skip
                self._send(job)

    def _give_up(self, job: _Job, exc: BaseException | None) -> None:
        first = str(exc).splitlines()[0] if exc is not None and str(exc) else ""
        last = f"{type(exc).__name__}: {first}" if exc is not None else "unknown"
        job.future.set_exception(
            WorkerCrashedError(
                f"operator {self._name!r}: the Ray actor running a micro-batch died "
                f"{job.crashes} time(s) on nodes that stayed alive "
                f"(max_worker_retries={self._max_retries}; node losses are not counted); "
                f"last error: {last}. The operator takes its worker down on these records "
                "(native crash, memory, os._exit): fix it, or raise max_worker_retries."
            )
        )

    def _fail_leftovers(self) -> None:
        with self._lock:
            leftover = [job for job, _, _ in self._pending.values()]
            self._pending.clear()
        leftover += [job for job in self._suspects if job.parked]
        for job in leftover:
            if not job.future.done():
                job.future.set_exception(
                    WorkerCrashedError(f"operator {self._name!r}: the pool was shut down")
                )

    def shutdown(self, wait_s: float = CLOSE_WAIT_S) -> None:
        """Stop collecting; keep the actors for the next iteration (see the module docstring)."""
        self._closed = True
        self._wake.set()
        self._collector.join(timeout=30)
        with self._lock:
            actors = [m.actor for m in self._slots]
            self._slots = []
        if self._ray.is_initialized():
            _keep_idle(self._key, actors, self._ray)
