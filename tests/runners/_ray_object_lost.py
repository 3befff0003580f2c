"""A result lost with its node, forced: a simulated 3-node Ray cluster as its own driver process.

Usage: ``python -m tests.runners._ray_object_lost``. One node (the victim) carries the ``work``
resource the pipeline's stage asks for, so its actors run there; its raylet answers object
pulls only after a long delay (Ray's own fault-injection setting ``RAY_testing_asio_delay_us``,
given to that raylet alone), so a result computed there stays in its object store, out of the
driver's reach. As soon as such a result is sealed there (Ray reports the object's location),
a second ``work`` node joins and the victim is removed: the result is lost with it, and the
pipeline must run that micro-batch again from its inputs on the new node. Prints one JSON
line: the digest of an uninterrupted run, the digest of the run that lost its node, and
whether a result the pipeline waited for was sealed on the victim when it was removed.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
import time
from typing import Any

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import numpy as np
import ray
from ray.cluster_utils import Cluster

from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon._engine.workers import ray_pool
from zephon._engine.workers.ray_pool import RayWorkerPool

FAST_FAILURE_DETECTION = {"health_check_period_ms": 500, "health_check_failure_threshold": 4}
PULL_DELAY = {
    "RAY_testing_asio_delay_us": "ObjectManagerService.grpc_server.Pull=600000000:600000000"
}


def widen(payload: dict[str, Any]) -> dict[str, Any]:
    """A 256 KiB array per record: results go through the object store, not inline."""
    rng = np.random.default_rng(int(payload["id"]))
    return {"id": payload["id"], "blob": rng.integers(0, 1 << 30, size=65536, dtype=np.int32)}


def build(remote: bool) -> Pipeline:
    docs = [{"id": i} for i in range(64)]
    source = StaticMixtureWorkSource(
        [Dataset.from_records("d", docs, shard_size=16)], chunk_size=16
    )
    where: dict[str, Any] = {"placement": "remote", "resources": {"work": 1}} if remote else {}
    return (
        Pipeline(source)
        .map_transform(widen, parallelism=2, **where)
        .batch(4)
        .options(runner="threads", canonical_replicas=1, max_inflight=4)
    )


def digest(pipe: Pipeline) -> str:
    h = hashlib.sha256()
    for batch in pipe:
        for record in batch:
            h.update(str(record.payload["id"]).encode() + record.payload["blob"].tobytes())
    return h.hexdigest()


def pending_on(pipe: Pipeline, node_id: str, running: threading.Thread) -> bool:
    """Wait until a result the pipeline waits for is sealed on ``node_id`` (True); False if
    the pipeline ended first."""
    while running.is_alive():
        engine = pipe._engine
        live = engine.resources.pools if engine is not None else []
        pools = [p for p in live if isinstance(p, RayWorkerPool)]
        refs = [ref for pool in pools for ref in list(pool._pending)]
        if refs:
            where = ray.experimental.get_object_locations(refs, timeout_ms=5000)
            if any(node_id in info.get("node_ids", []) for info in where.values()):
                return True
        time.sleep(0.05)
    return False


def main() -> None:
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 1, "include_dashboard": False, "_system_config": FAST_FAILURE_DETECTION,
        },
    )  # fmt: skip
    victim = cluster.add_node(num_cpus=1, resources={"work": 8}, env_vars=PULL_DELAY)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    out: dict[str, Any] = {"expected": digest(build(remote=False))}
    try:
        pipe = build(remote=True)
        result: dict[str, Any] = {}
        worker = threading.Thread(target=lambda: result.update(got=digest(pipe)))
        worker.start()
        out["sealed_on_victim"] = pending_on(pipe, victim.node_id, worker)
        cluster.add_node(num_cpus=1, resources={"work": 8})
        cluster.remove_node(victim, allow_graceful=False)
        worker.join()
        out["got"] = result.get("got")
    finally:
        ray_pool.release_actors()
        ray.shutdown()
        cluster.shutdown()
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    sys.exit(main())
