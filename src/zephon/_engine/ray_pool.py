"""Ray actors as a worker pool: ``runner="ray"`` or operators added with ``placement="remote"``.

Each operator gets a group of ``parallelism`` actors, each holding its own copy of the operator
(shipped with cloudpickle, ``setup`` run inside the actor). The pool has the same shape as the
thread and process pools (``submit(elems) -> Future``), so the engine's driver thread keeps
the accumulator, bounds what is in flight and releases results by sequence number: the output
is identical to the inline runner whatever the cluster does. A micro-batch goes to the least
loaded actor. When an actor dies (its process killed, its node lost), or a result is lost with
the node that held it, the actor is replaced and the micro-batch is sent again from its inputs
(which the driver keeps until the result arrives; Ray's object reconstruction is never relied
on), up to ``max_retries`` times each.

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

import atexit
import contextlib
import hashlib
import logging
import os
import threading
from collections import OrderedDict
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Any, assert_never

import cloudpickle

from zephon._engine.messages import Failed, Ok, RunReply
from zephon._engine.pools import WorkerCrashedError, WorkerPool
from zephon._engine.shm import resolve_items
from zephon._engine.stage import annotate, call_process_many
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


atexit.register(release_actors)


@dataclass
class _Job:
    elems: list[StreamItem]
    future: Future[list[StreamItem]]
    crashes: int = 0


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
        kept = _take_idle(self._key, parallelism)
        self._actors = [a if a is not None else self._new_actor(i) for i, a in enumerate(kept)]
        self._load = [0] * parallelism
        self._pending: dict[Any, tuple[_Job, int, Any]] = {}
        self._wake = threading.Event()
        self._collector = threading.Thread(
            target=self._collect, name=f"zephon-engine-ray-{op.name}", daemon=True
        )
        self._collector.start()

    def _new_actor(self, slot: int) -> Any:
        options: dict[str, Any] = {"scheduling_strategy": "SPREAD"}
        if self._resources:
            options["resources"] = self._resources
        return self._cls.options(**options).remote(self._blob, self._ctx, slot)

    def pids(self) -> list[int]:
        """Process ids of the actors (starts them if needed; for tests and diagnostics)."""
        with self._lock:
            actors = list(self._actors)
        return [int(p) for p in self._ray.get([a.pid.remote() for a in actors])]

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
        with self._lock:
            slot = min(range(len(self._load)), key=self._load.__getitem__)
            self._load[slot] += 1
            actor = self._actors[slot]
            ref = actor.run.remote(job.elems)
            self._pending[ref] = (job, slot, actor)
        self._wake.set()

    def _collect(self) -> None:
        ray = self._ray
        while not self._closed:
            with self._lock:
                refs = list(self._pending)
            if not refs:
                self._wake.wait(timeout=0.5)
                self._wake.clear()
                continue
            try:
                ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0.01, fetch_local=True)
            except BaseException:
                ready = []
            for ref in ready:
                with self._lock:
                    job, slot, actor = self._pending.pop(ref)
                    self._load[slot] -= 1
                try:
                    self._done(job, slot, actor, ref)
                except BaseException as exc:  # never leave a future hanging
                    if not job.future.done():
                        job.future.set_exception(annotate(exc, self._name))
        with self._lock:
            leftover = list(self._pending.values())
            self._pending.clear()
        for job, _, _ in leftover:
            if not job.future.done():
                job.future.set_exception(
                    WorkerCrashedError(f"operator {self._name!r}: the pool was shut down")
                )

    def _done(self, job: _Job, slot: int, actor: Any, ref: Any) -> None:
        errors = self._ray.exceptions
        try:
            reply: RunReply = self._ray.get(ref)
        except errors.RayActorError as exc:
            self._actor_died(job, slot, actor, exc)
            return
        except (errors.ObjectLostError, errors.NodeDiedError) as exc:
            # The result lived on a node that is gone (ObjectReconstructionFailedError and
            # the other ObjectLostErrors): never rely on Ray rebuilding it; run the micro-batch
            # again from its inputs, which the driver still holds.
            self._actor_died(job, slot, actor, exc)
            return
        match reply:
            case Ok():
                job.future.set_result(reply.out)
            case Failed():
                job.future.set_exception(reply.error)
            case _:
                assert_never(reply)

    def _actor_died(self, job: _Job, slot: int, actor: Any, exc: BaseException) -> None:
        """``actor`` died or lost the result of ``job``: replace it, send ``job`` again."""
        with self._lock:
            if self._actors[slot] is actor:
                # The actor is gone already; dropping its handle is all that is left to do.
                self._actors[slot] = self._new_actor(slot)
                self.replaced += 1
        job.crashes += 1
        if job.crashes > self._max_retries:
            first = str(exc).splitlines()[0] if str(exc) else ""
            job.future.set_exception(
                WorkerCrashedError(
                    f"operator {self._name!r}: the Ray actor running a micro-batch died "
                    f"{job.crashes} time(s) (max_worker_retries={self._max_retries}); last "
                    f"error: {type(exc).__name__}: {first}"
                )
            )
            return
        log.warning(
            "zephon: operator %r: Ray actor %d died or its node was lost (%s); replaced it and "
            "retrying the micro-batch from its inputs (attempt %d of %d)",
            self._name,
            slot,
            type(exc).__name__,
            job.crashes + 1,
            self._max_retries + 1,
        )
        self._send(job)

    def shutdown(self) -> None:
        """Stop collecting; keep the actors for the next iteration (see the module docstring)."""
        self._closed = True
        self._wake.set()
        self._collector.join(timeout=30)
        with self._lock:
            actors = list(self._actors)
            self._actors = []
        if self._ray.is_initialized():
            _keep_idle(self._key, actors, self._ray)
