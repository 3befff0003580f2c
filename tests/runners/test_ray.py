"""The Ray runner (local cluster, 2 CPUs) gives the same bytes as inline, also after restore
and after an actor is killed."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests._corpus import make_docs
from tests.engine._sources import RangeSource
from tests.runners._faulty import KillWorkerOp
from tests.runners._pipes import digest, reference, run_with_stops, stateful
from zephon import Dataset, Pipeline
from zephon._engine.workers.pools import WorkerCrashedError


@pytest.mark.timeout(120)
def test_ray_runner_equals_inline_on_the_reference_pipeline(ray_session, docs, hf_tokenizer_dir):
    expected = digest(reference(docs, hf_tokenizer_dir, "inline", 1))
    assert digest(reference(docs, hf_tokenizer_dir, "ray", 2)) == expected
    assert digest(reference(docs, hf_tokenizer_dir, "ray", "auto")) == expected


@pytest.mark.timeout(120)
def test_ray_packing_and_shuffle_equal_inline_also_after_restore(
    ray_session, docs, hf_tokenizer_dir
):
    expected = digest(stateful(docs, hf_tokenizer_dir, "inline", 1))
    # Two Ray engines: the first stops after 11 batches, the second restores and finishes.
    resumed = run_with_stops(lambda: stateful(docs, hf_tokenizer_dir, "ray", 1), [11])
    assert resumed == expected


@pytest.mark.timeout(120)
def test_remote_placement_puts_one_operator_on_actors(ray_session, docs, hf_tokenizer_dir):
    def build(runner: str) -> Pipeline:
        ds = Dataset.from_records("docs", docs, shard_size=50)
        return (
            Pipeline(RangeSource([ds], chunk_size=40))
            .decode_text()
            .tokenize(hf_tokenizer_dir, parallelism=2, placement="remote")
            .batch(8)
            .options(runner=runner, canonical_replicas=2)
        )

    runners = {s.op_name: s.runner for s in build("threads").explain().stages}
    assert runners["tokenize"] == "ray" and runners["decode_text"] == "threads"
    assert runners["batch"] == "driver"
    assert digest(build("threads")) == digest(build("inline"))


@pytest.mark.timeout(180)
def test_ray_batches_report_the_provenance_inline_does(ray_session, tmp_path):
    """Every delivered batch names the same segments (files, lines, spans) as inline's, also
    after a restore, and a traced step re-reads to exactly the row's tokens."""
    from tests.provenance._mixture import check_batch, make_mixture
    from zephon.config import load_config

    yaml = make_mixture(tmp_path, 120)

    def pipe(runner: str) -> Pipeline:
        return load_config(yaml).build().options(runner=runner)

    expected = [b.provenance() for b in pipe("inline")]
    got = pipe("ray")
    it = iter(got)
    seen = [next(it).provenance() for _ in range(len(expected) // 2)]
    batch = next(it)
    seen.append(batch.provenance())
    state = got.checkpoint()
    it.close()  # type: ignore[attr-defined]
    assert check_batch(got, batch) and seen == expected[: len(seen)]
    restored = pipe("ray").restore(state)
    seen += [b.provenance() for b in restored]
    assert seen == expected


def faulty(docs: list[dict[str, Any]], op: KillWorkerOp, runner: str, **opts: Any) -> Pipeline:
    ds = Dataset.from_records("docs", docs, shard_size=50)
    return (
        Pipeline(RangeSource([ds], chunk_size=40))
        .add_op(op, parallelism=2)
        .tokenize("bytes", max_length=40)
        .batch(8)
        .options(runner=runner, canonical_replicas=2, **opts)
    )


@pytest.mark.timeout(120)
def test_killed_actor_is_replaced_and_output_identical(ray_session, docs, tmp_path):
    marker = tmp_path / "killed"
    marker.touch()
    expected = digest(faulty(docs, KillWorkerOp(marker, victim=222), "inline"))
    marker.unlink()
    pipe = faulty(docs, KillWorkerOp(marker, victim=222), "ray")
    assert digest(pipe) == expected
    assert marker.exists()  # the actor holding record 222 really died


@pytest.mark.timeout(120)
@pytest.mark.parametrize("retries", [0, 2])
def test_a_micro_batch_that_always_kills_its_actor_fails_after_its_budget(
    ray_session, docs, tmp_path, retries
):
    """Deaths on a node that stays alive are crashes: max_worker_retries of them, then one
    clear error, never a retry forever as a node loss would get."""
    marker = tmp_path / "killed"
    pipe = faulty(docs[:40], KillWorkerOp(marker, victim=3, always=True), "ray",
                  max_worker_retries=retries)  # fmt: skip
    with pytest.raises(WorkerCrashedError) as caught:
        list(pipe)
    message = str(caught.value)
    assert "operator 'kill_worker'" in message
    assert f"died {retries + 1} time(s) on nodes that stayed alive" in message
    assert f"max_worker_retries={retries}" in message and "raise max_worker_retries" in message
    killed = marker.read_text().split()
    assert len(killed) == retries + 1 and len(set(killed)) == retries + 1  # a new actor each


DRIVER = """
import hashlib, sys
import ray
from pathlib import Path
from tests._corpus import make_docs
from tests.runners._pipes import digest, reference

ray.init(address=sys.argv[1], log_to_driver=False)
out = digest(reference(make_docs(600), Path(sys.argv[2]), "ray", 2))
print("DIGEST", hashlib.sha256(repr(out).encode()).hexdigest())
"""


@pytest.mark.timeout(120)
def test_a_driver_attached_to_an_existing_cluster_gets_the_same_bytes(
    ray_session, docs, hf_tokenizer_dir, tmp_path
):
    assert docs == make_docs(600)
    expected = digest(reference(docs, hf_tokenizer_dir, "inline", 1))
    address = ray_session.get_runtime_context().gcs_address
    root = Path(__file__).resolve().parents[2]
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    proc = subprocess.run(
        [sys.executable, str(script), address, str(hf_tokenizer_dir)],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    # Ray may print its own warnings on the driver's stdout: read our line only.
    digests = [line.split()[1] for line in proc.stdout.splitlines() if line.startswith("DIGEST ")]
    assert digests == [hashlib.sha256(repr(expected).encode()).hexdigest()]


@pytest.mark.timeout(180)
def test_checkpoint_after_a_ray_worker_failure_resumes_exactly(
    ray_session, tmp_path, docs, hf_tokenizer_dir
):
    from tests.runners._failure import fail_then_resume, faulty_stateful
    from tests.runners._faulty import FailWhileArmedOp
    from tests.runners._pipes import key

    armed = tmp_path / "armed"

    many = [{**d, "id": i} for i, d in enumerate(docs * 4)]  # more than the engine buffers

    def build(runner: str = "ray") -> Pipeline:
        # any record fails while armed; armed once 3 batches were received
        return faulty_stateful(many, hf_tokenizer_dir, FailWhileArmedOp(armed, None), runner)

    expected = [key(item) for item in build("inline")]
    first, rest, error = fail_then_resume(build, armed, arm_after=3)
    assert "is bad" in str(error)
    assert 3 <= len(first) < len(expected)
    assert first + rest == expected
