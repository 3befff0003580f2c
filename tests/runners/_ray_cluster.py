"""A simulated 4-node Ray cluster on this machine, run as its own driver process.

Usage: ``python -m tests.runners._ray_cluster TOKENIZER_DIR DOCS``. The head node (where this
driver runs) carries no label; one node is labelled ``io`` and two ``cpu``. Fetch asks for
``io``, decode and tokenize for ``cpu``, so no stage runs next to the driver. It runs the
pipeline twice (the second iteration must reuse the actors), then once more removing a ``cpu``
node that holds actors after a few batches, and prints one JSON line: digests, actor
placement, pids of every process the cluster started, and throughput.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from typing import Any

# Every node on 127.0.0.1 (Ray otherwise advertises the address it would use to go out).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import ray
from ray.cluster_utils import Cluster

from tests._corpus import make_docs
from tests.runners._pipes import key
from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon._engine.workers import ray_pool

LABELS = {"io": {"io": 8.0}, "cpu-a": {"cpu": 8.0}, "cpu-b": {"cpu": 8.0}}
FAST_FAILURE_DETECTION = {"health_check_period_ms": 500, "health_check_failure_threshold": 4}


def build(docs: list[dict[str, Any]], tok: str, remote: bool) -> Pipeline:
    io: dict[str, Any] = {"placement": "remote", "resources": {"io": 1}} if remote else {}
    cpu: dict[str, Any] = {"placement": "remote", "resources": {"cpu": 1}} if remote else {}
    source = StaticMixtureWorkSource(
        [Dataset.from_records("docs", docs, shard_size=50)], chunk_size=40, seed=7
    )
    return (
        Pipeline(source)
        .fetch(parallelism=1, **io)
        .decode_text(parallelism=2, **cpu)
        .tokenize(tok, max_length=48, parallelism=2, **cpu)
        .pack_flat(64, pad_token_id=0)
        .batch(8)
        .options(runner="threads", canonical_replicas=3, max_inflight=4)
    )


def run(pipe: Pipeline, on_batch: Any = None) -> tuple[str, int, float]:
    """(sha256 of every batch's bytes, records, seconds)."""
    h, records, start = hashlib.sha256(), 0, time.perf_counter()
    for i, batch in enumerate(pipe):
        h.update(repr(key(batch)).encode())
        records += len(batch.records)
        if on_batch is not None:
            on_batch(i)
    return h.hexdigest(), records, time.perf_counter() - start


def node_of(actor: Any) -> str:
    """The actor's node, or "dead" (an idle actor of a lost node, replaced when next used)."""
    try:
        return str(ray.get(actor.node_id.remote(), timeout=60))
    except ray.exceptions.RayActorError:
        return "dead"


def wait_until_dead(node_id: str, timeout_s: float = 60.0) -> None:
    """Poll the cluster's view until ``node_id`` is marked dead (its health checks failed)."""
    deadline = time.monotonic() + timeout_s
    while any(n["NodeID"] == node_id and n["Alive"] for n in ray.nodes()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"Ray still reports node {node_id} alive after {timeout_s} s")
        time.sleep(0.2)


def placement() -> dict[str, list[list[str]]]:
    """Per operator: [actor id, node id] of each idle actor."""
    return {
        op: [[a._actor_id.hex(), node_of(a)] for a in actors]
        for op, actors in sorted(ray_pool.idle_actors().items())
    }


def start() -> tuple[Cluster, dict[str, Any]]:
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 1,
            "include_dashboard": False,
            "_system_config": FAST_FAILURE_DETECTION,
        },
    )
    nodes = {name: cluster.add_node(num_cpus=1, resources=res) for name, res in LABELS.items()}
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    return cluster, nodes


def node_pids(node: Any) -> list[int]:
    return [p.process.pid for procs in node.all_processes.values() for p in procs]


def scenario(cluster: Cluster, nodes: dict[str, Any], docs: list[dict[str, Any]], tok: str):
    ids = {name: node.node_id for name, node in nodes.items()}
    out: dict[str, Any] = {"nodes": ids, "driver_node": ray.get_runtime_context().get_node_id()}
    out["inline"] = run(build(docs, tok, remote=False).options(runner="inline"))
    pipe = build(docs, tok, remote=True)
    out["first"] = run(pipe)
    out["first_placement"] = placement()
    out["second"] = run(pipe)
    out["second_placement"] = placement()
    busy = {node for op in ("decode_text", "tokenize") for _, node in out["second_placement"][op]}
    victim = next(name for name in ("cpu-b", "cpu-a") if ids[name] in busy)
    out["removed"] = victim

    def remove_after_first(i: int) -> None:
        if i == 1:
            cluster.remove_node(nodes[victim], allow_graceful=False)

    out["pids"] = [pid for node in cluster.list_all_nodes() for pid in node_pids(node)]
    out["after_removal"] = run(build(docs, tok, remote=True), remove_after_first)
    wait_until_dead(ids[victim])  # on a loaded machine the run can end before Ray notices
    # an idle actor of the lost node is replaced when next used: on a loaded machine the run
    # above can end before it needs one, so one more run takes every stage's actors again
    out["after_death"] = run(build(docs, tok, remote=True))
    out["final_placement"] = placement()
    return out


def main() -> None:
    tok, n_docs = sys.argv[1], int(sys.argv[2])
    cluster, nodes = start()
    try:
        out = scenario(cluster, nodes, make_docs(n_docs), tok)
    finally:
        ray_pool.release_actors()
        ray.shutdown()
        cluster.shutdown()
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
