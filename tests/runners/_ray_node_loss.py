"""Busy Ray worker nodes removed again and again mid-run: a simulated 3-node cluster (head +
two ``cpu`` nodes, loopback) as its own driver process.

Usage: ``python -m tests.runners._ray_node_loss TOKENIZER_DIR RUNS REMOVALS DOCS RETRIES``
(``RETRIES``: the pipeline's ``max_worker_retries``; 0 proves node losses cost none). In each
run a consumer thread iterates the pipeline while the main thread (Ray starts nodes only from
there), ``REMOVALS`` times, removes the ``cpu`` node with the most micro-batches in flight
on the ``held`` stage (SIGKILL of its raylet and workers, as a machine that vanishes) and adds
a replacement; that stage waits while a removal is under way, so the victim's micro-batches are
in flight for certain. Removal
n starts as the consumer passes checkpoint n (batch numbers spread over the first half of the
run, while the Ray stages still have work), and the consumer passes checkpoint n + 1 only once
it is done, so every removal lands mid-run. Every batch of every
run is compared with the inline run's. Prints one JSON line: per run whether its output was
identical, the batch where they first differ, the error that ended it (if any), what each
removal hit (micro-batches in flight on the victim; when none, what the pools held), and the
pids of every process the cluster ever started.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any

# Every node on 127.0.0.1 (Ray otherwise advertises the address it would use to go out).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import ray
from ray.cluster_utils import Cluster

from tests._corpus import make_docs
from tests.runners._pipes import key
from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon._engine import ray_pool
from zephon._engine.ray_nodes import detection_window_s
from zephon._engine.ray_pool import RayWorkerPool

WORKER = {"num_cpus": 1, "resources": {"cpu": 8.0}}
FAST_FAILURE_DETECTION = {"health_check_period_ms": 500, "health_check_failure_threshold": 4}
BUSY_WAIT_S = 30.0  # how long to look for a node with work in flight (actors may be starting)
HOLD_ENV = "ZEPHON_TEST_RAY_HOLD"  # a file: while it exists, ``held`` micro-batches wait


def held(payload: Any) -> Any:
    """Passes ``payload`` on, once the chaos side lets go: a node removed while it holds is
    certain to have work in flight (without the hold, that work may finish during removal)."""
    hold = os.environ.get(HOLD_ENV)
    while hold and os.path.exists(hold):
        time.sleep(0.002)
    return payload


def build(docs: list[dict[str, Any]], tok: str, remote: bool, retries: int = 3) -> Pipeline:
    cpu: dict[str, Any] = {"placement": "remote", "resources": {"cpu": 1}} if remote else {}
    source = StaticMixtureWorkSource(
        [Dataset.from_records("docs", docs, shard_size=50)], chunk_size=20, seed=7
    )
    return (
        Pipeline(source)
        .decode_text(parallelism=2, **cpu)
        .map_transform(held, name="held", parallelism=2, **cpu)
        .tokenize(tok, max_length=48, parallelism=2, **cpu)
        .pack_flat(64, pad_token_id=0)
        .batch(4)
        .options(runner="threads", canonical_replicas=2, max_inflight=4, max_worker_retries=retries)
    )


def ray_pools(pipe: Pipeline) -> list[RayWorkerPool]:
    engine = pipe._engine
    live = engine.resources.pools if engine is not None else []
    return [p for p in live if isinstance(p, RayWorkerPool)]


def held_nodes(pipe: Pipeline) -> dict[str, int]:
    """Micro-batches in flight per node on the ``held`` stage (none finishes while held)."""
    counts: dict[str, int] = {}
    for pool in ray_pools(pipe):
        if pool._name != "held":
            continue
        for node, n in pool.busy_nodes().items():
            counts[node] = counts.get(node, 0) + n
    return counts


class Chaos:
    """Removes busy ``cpu`` nodes from the main thread (Ray starts nodes only from there)
    while a consumer thread iterates the pipeline."""

    def __init__(self, cluster: Cluster, workers: list[Any], pipe: Pipeline) -> None:
        self.cluster, self.workers, self.pipe = cluster, workers, pipe
        self.ready = threading.Semaphore(0)  # the consumer may pass its next checkpoint
        self.passed = threading.Semaphore(0)  # the consumer passed a checkpoint
        self.finished = threading.Event()
        self.removals: list[dict[str, Any]] = []
        self.idle: list[Any] = []  # when no node was busy: (in flight, probes, unknown nodes)

    def victim(self) -> tuple[Any, int]:
        """The worker node with the most micro-batches in flight (any worker after a while)."""
        by_id = {node.node_id: node for node in self.workers}
        deadline = time.monotonic() + BUSY_WAIT_S
        while not self.finished.is_set() and time.monotonic() < deadline:
            busy = {n: c for n, c in held_nodes(self.pipe).items() if n in by_id}
            if busy:
                node_id = max(busy, key=busy.__getitem__)
                return by_id[node_id], busy[node_id]
            time.sleep(0.005)
        self.idle.append(
            [(len(p._pending), len(p._probes), [m.node is None for m in p._slots])
             for p in ray_pools(self.pipe)]
        )  # fmt: skip
        return self.workers[0], 0

    def remove_one(self) -> None:
        """Remove the busiest worker node, then add one in its place (it joins in seconds)."""
        hold = Path(os.environ[HOLD_ENV])
        hold.touch()
        try:
            victim, pending = self.victim()
            start = time.monotonic()
            self.cluster.remove_node(victim, allow_graceful=False)
        finally:
            hold.unlink()
        self.workers.remove(victim)
        self.workers.append(self.cluster.add_node(**WORKER))
        self.removals.append({"pending": pending, "join_s": round(time.monotonic() - start, 2)})

    def drive(self, removals: int) -> None:
        """Removal n starts as the consumer passes checkpoint n, so it lands while the
        pipeline runs; the consumer passes checkpoint n + 1 only once it is done."""
        try:
            for _ in range(removals):
                self.ready.release()
                self.passed.acquire()
                if self.finished.is_set():
                    return
                self.remove_one()
        finally:
            self.ready.release()  # the last checkpoint (or all of them once this failed)
            for _ in range(removals):
                self.ready.release()


def consume(pipe: Pipeline, chaos: Chaos, marks: list[int], out: dict[str, Any]) -> None:
    """The consumer thread: waits at each checkpoint until the chaos side lets it pass."""
    got: list[Any] = out["got"]
    try:
        for i, batch in enumerate(pipe):
            got.append(key(batch))
            if i in marks:
                chaos.ready.acquire()
                chaos.passed.release()
    except Exception as exc:
        out["error"] = "".join(traceback.format_exception_only(exc)).strip()[:2000]
    finally:
        chaos.finished.set()
        chaos.passed.release()  # wakes the main thread if it waits for a checkpoint


def run_once(
    cluster: Cluster, workers: list[Any], pipe: Pipeline, expected: list[Any], removals: int
) -> dict[str, Any]:
    """One run with ``removals`` node losses, compared batch by batch with ``expected``."""
    # Checkpoints over the first half of the run: the Ray stages run ahead of the consumer and
    # are done well before it has every batch (their output waits in the driver's stages).
    marks = [len(expected) * (i + 1) // (2 * removals + 2) for i in range(removals + 1)]
    chaos = Chaos(cluster, workers, pipe)
    out: dict[str, Any] = {"error": None, "got": []}
    start = time.perf_counter()
    consumer = threading.Thread(target=consume, args=(pipe, chaos, marks, out))
    consumer.start()
    try:
        chaos.drive(removals)
    finally:
        consumer.join()
    got = out.pop("got")
    out["seconds"] = round(time.perf_counter() - start, 2)
    out["batches"] = len(got)
    out["identical"] = got == expected
    out["first_difference"] = next(
        (i for i, (a, b) in enumerate(zip(got, expected, strict=False)) if a != b),
        None if len(got) == len(expected) else min(len(got), len(expected)),
    )
    out["removals"] = chaos.removals
    out["idle"] = chaos.idle
    return out


def node_pids(node: Any) -> list[int]:
    return [p.process.pid for procs in node.all_processes.values() for p in procs]


def main() -> None:
    tok, runs, removals, n_docs, retries = sys.argv[1], *map(int, sys.argv[2:6])
    # Set before any node starts, so every Ray worker inherits it.
    os.environ[HOLD_ENV] = str(Path(tempfile.mkdtemp(prefix="zephon-ray-hold-")) / "hold")
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 1, "include_dashboard": False, "_system_config": FAST_FAILURE_DETECTION,
        },
    )  # fmt: skip
    pids: set[int] = set(node_pids(cluster.head_node))
    out: dict[str, Any] = {"runs": []}
    try:
        workers = [cluster.add_node(**WORKER) for _ in range(2)]
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False)
        out["detection_window_s"] = detection_window_s(ray)
        docs = make_docs(n_docs)
        expected = [key(b) for b in build(docs, tok, remote=False).options(runner="inline")]
        out["batches"] = len(expected)
        for _ in range(runs):
            pids.update(pid for node in workers for pid in node_pids(node))
            pipe = build(docs, tok, remote=True, retries=retries)
            out["runs"].append(run_once(cluster, workers, pipe, expected, removals))
            pids.update(pid for node in workers for pid in node_pids(node))
    finally:
        ray_pool.release_actors()
        ray.shutdown()
        pids.update(pid for node in cluster.list_all_nodes() for pid in node_pids(node))
        cluster.shutdown()
    out["pids"] = sorted(pids)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
