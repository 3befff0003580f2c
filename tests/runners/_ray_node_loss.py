"""Busy Ray worker nodes removed again and again mid-run: a simulated 3-node cluster (head +
two ``cpu`` nodes, loopback) as its own driver process.

Usage: ``python -m tests.runners._ray_node_loss TOKENIZER_DIR RUNS REMOVALS DOCS RETRIES``
(``RETRIES``: the pipeline's ``max_worker_retries``; 0 proves node losses cost none). In each
run a consumer thread iterates the pipeline while the main thread (Ray starts nodes only from
there) removes ``cpu`` nodes ``REMOVALS`` times (SIGKILL of its raylet and workers, as a
machine that vanishes) and adds a replacement each time. Every removal is certain to hit work
in flight, and to land mid-run: the ``held`` stage keeps each stop record (one document a
removal, spread over the first half of the corpus) waiting on its actor until the node it
waits on is gone; run again on a live actor, it passes. Every batch of every run is compared
with the inline run's. Prints one JSON line: per run whether its output was identical, the
batch where they first differ, the error that ended it (if any), what each removal hit (the
stop record, micro-batches in flight on the victim's ``held`` stage), and the pids of every
process the cluster ever started.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
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
from zephon._engine.workers import ray_pool
from zephon._engine.workers.ray_nodes import detection_window_s
from zephon._engine.workers.ray_pool import RayWorkerPool

WORKER = {"num_cpus": 1, "resources": {"cpu": 8.0}}
FAST_FAILURE_DETECTION = {"health_check_period_ms": 500, "health_check_failure_threshold": 4}
HOLD_ENV = "ZEPHON_TEST_RAY_HOLD"  # a folder: stop texts, hold files, arrival notes


def held(payload: Any) -> Any:
    """Passes ``payload`` on, except the stop record of removal k while ``hold-k`` exists: that
    one notes where it waits (``arrived-k-NODE``) and waits there, so the node the chaos side
    removes has a micro-batch in flight for certain. Run again elsewhere after the removal, it
    passes (the hold is gone): output is unchanged."""
    folder = os.environ.get(HOLD_ENV)
    stops = _stops(folder) if folder else {}
    k = stops.get(str(payload.get("text") if isinstance(payload, dict) else payload).strip())
    if k is None or not os.path.exists(os.path.join(folder or "", f"hold-{k}")):
        return payload
    node = ray.get_runtime_context().get_node_id()
    Path(folder or "", f"arrived-{k}-{node}").touch()
    while os.path.exists(os.path.join(folder or "", f"hold-{k}")):
        time.sleep(0.005)
    return payload


_STOPS: dict[str, dict[str, int]] = {}


def _stops(folder: str) -> dict[str, int]:
    """The stop texts (text -> removal number), read once per process."""
    if folder not in _STOPS:
        path = Path(folder, "stops.json")
        _STOPS[folder] = json.loads(path.read_text()) if path.exists() else {}
    return _STOPS[folder]


def stop_texts(docs: list[dict[str, Any]], removals: int) -> dict[str, int]:
    """One document a removal, spread over the first half of the corpus, each text unique."""
    texts = [str(doc["text"]).strip() for doc in docs]  # as decoded
    counts: dict[str, int] = {}
    for text in texts:
        counts[text] = counts.get(text, 0) + 1
    unique = [i for i, text in enumerate(texts) if counts[text] == 1]
    picks = [unique[len(unique) * (k + 1) // (2 * removals + 2)] for k in range(removals)]
    return {texts[i]: k for k, i in enumerate(picks)}


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
    """Micro-batches in flight per node on the ``held`` stage."""
    counts: dict[str, int] = {}
    for pool in ray_pools(pipe):
        if pool._name != "held":
            continue
        for node, n in pool.busy_nodes().items():
            counts[node] = counts.get(node, 0) + n
    return counts


class Chaos:
    """Removes ``cpu`` nodes from the main thread (Ray starts nodes only from there) while a
    consumer thread iterates the pipeline: each removal takes the node where a stop record
    waits."""

    def __init__(self, cluster: Cluster, workers: list[Any], pipe: Pipeline, folder: Path) -> None:
        self.cluster, self.workers, self.pipe, self.folder = cluster, workers, pipe, folder
        self.finished = threading.Event()
        self.removals: list[dict[str, Any]] = []

    def arrived(self) -> tuple[int, Any] | None:
        """A stop record still held and the live worker node it waits on (None once the run
        ended). Any of them, whichever came first: a held record blocks its actor's queue,
        so waiting for them in a fixed order could wait forever."""
        while not self.finished.is_set():
            by_id = {node.node_id: node for node in self.workers}
            for note in sorted(self.folder.glob("arrived-*")):
                _, k, node_id = note.name.split("-", 2)
                if node_id in by_id and (self.folder / f"hold-{k}").exists():
                    return int(k), by_id[node_id]
            time.sleep(0.005)
        return None

    def drive(self, removals: int) -> None:
        """Each removal: wait for a stop record to wait on a node, remove that node, add one
        in its place (it joins in seconds), then let the record go."""
        try:
            for _ in range(removals):
                found = self.arrived()
                if found is None:
                    return
                k, victim = found
                pending = held_nodes(self.pipe).get(victim.node_id, 0)
                start = time.monotonic()
                self.cluster.remove_node(victim, allow_graceful=False)
                self.workers.remove(victim)
                self.workers.append(self.cluster.add_node(**WORKER))
                join_s = round(time.monotonic() - start, 2)
                self.removals.append({"stop": k, "pending": pending, "join_s": join_s})
                (self.folder / f"hold-{k}").unlink()
        finally:
            for hold in self.folder.glob("hold-*"):
                hold.unlink()  # a run that ended early leaves nothing waiting


def consume(pipe: Pipeline, chaos: Chaos, out: dict[str, Any]) -> None:
    """The consumer thread: every batch, in order."""
    got: list[Any] = out["got"]
    try:
        for batch in pipe:
            got.append(key(batch))
    except Exception as exc:
        out["error"] = "".join(traceback.format_exception_only(exc)).strip()[:2000]
    finally:
        chaos.finished.set()


def run_once(
    cluster: Cluster, workers: list[Any], pipe: Pipeline, expected: list[Any], removals: int
) -> dict[str, Any]:
    """One run with ``removals`` node losses, compared batch by batch with ``expected``."""
    folder = Path(os.environ[HOLD_ENV])
    for note in folder.glob("arrived-*"):
        note.unlink()
    for k in range(removals):
        (folder / f"hold-{k}").touch()
    chaos = Chaos(cluster, workers, pipe, folder)
    out: dict[str, Any] = {"error": None, "got": []}
    start = time.perf_counter()
    consumer = threading.Thread(target=consume, args=(pipe, chaos, out))
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
    return out


def node_pids(node: Any) -> list[int]:
    return [p.process.pid for procs in node.all_processes.values() for p in procs]


def main() -> None:
    tok, runs, removals, n_docs, retries = sys.argv[1], *map(int, sys.argv[2:6])
    # Set before any node starts, so every Ray worker inherits it.
    os.environ[HOLD_ENV] = tempfile.mkdtemp(prefix="zephon-ray-hold-")
    atexit.register(shutil.rmtree, os.environ[HOLD_ENV], ignore_errors=True)
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
        stops = Path(os.environ[HOLD_ENV], "stops.json")
        stops.write_text(json.dumps(stop_texts(docs, removals)))
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
