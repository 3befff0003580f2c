"""pipeline.iter_training: model inputs built in the engine process equal those built in the
training process, checkpoints taken while reading them resume exactly, their shared-memory
blocks are written again only once released, and a killed engine leaves none behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import zephon
from tests.runners._leaks import our_segments, wait_gone
from tests.runners._pipes import stateful
from zephon import Pipeline
from zephon.errors import ConfigError, EngineProcessError, MissingFieldError

HF: dict[str, Any] = {"convention": "hf", "return_tensors": "pt"}


def build(docs: list[dict[str, Any]], tok: Path, **opts: Any) -> Pipeline:
    """Shuffle, pack_flat and batch on two lanes; every array through shared memory."""
    return stateful(docs, tok, "threads", 2, shm_min_bytes=1, **opts)


def as_bytes(inputs: dict[str, Any]) -> list[Any]:
    """Every key, dtype, shape and byte of one batch's model inputs."""
    out: list[Any] = []
    for key, value in inputs.items():
        if isinstance(value, torch.Tensor | np.ndarray):
            array = value.numpy() if isinstance(value, torch.Tensor) else value
            out.append((key, type(value).__name__, str(array.dtype), array.shape, array.tobytes()))
        else:
            out.append((key, value))
    return out


def reference(docs: list[dict[str, Any]], tok: Path, **kwargs: Any) -> list[list[Any]]:
    return [as_bytes(batch.to_training(**kwargs)) for batch in build(docs, tok)]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("engine_process", [True, False])
def test_the_inputs_equal_to_training_of_each_batch(docs, hf_tokenizer_dir, engine_process):
    expected = reference(docs, hf_tokenizer_dir, **HF)
    assert len(expected) > 20
    pipe = build(docs, hf_tokenizer_dir)
    held = list(pipe.iter_training(engine_process=engine_process, **HF))  # all kept alive
    assert [as_bytes(inputs) for inputs in held] == expected
    numpy = pipe.set_epoch(0).iter_training(engine_process=engine_process, pad_token_id=0)
    assert [as_bytes(inputs) for inputs in numpy] == reference(
        docs, hf_tokenizer_dir, pad_token_id=0
    )


@pytest.mark.timeout(180)
def test_inputs_dropped_as_they_come_free_their_blocks_for_later_ones(docs, hf_tokenizer_dir):
    expected = reference(docs, hf_tokenizer_dir, **HF)
    pipe = build(docs, hf_tokenizer_dir, queue_size=4)
    got, names = [], set()
    for inputs in pipe.iter_training(**HF):
        got.append(as_bytes(inputs))  # read, then dropped at the next item
        engine = pipe._engine
        assert engine is not None and engine.pid is not None
        names.update(our_segments(engine.pid))
    assert got == expected
    # the engine writes released blocks again: a few files serve the whole run
    assert len(names) <= 12 < len(expected)


def pid_of(batch: Any) -> dict[str, Any]:
    return {"pid": os.getpid(), "input_ids": batch.to_training()["input_ids"]}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("engine_process", [True, False])
def test_a_transform_runs_where_the_engine_runs(docs, hf_tokenizer_dir, engine_process):
    pids = {inputs["pid"] for inputs in build(docs, hf_tokenizer_dir).iter_training(
        pid_of, engine_process=engine_process
    )}  # fmt: skip
    assert (pids == {os.getpid()}) != engine_process and len(pids) == 1


@pytest.mark.timeout(180)
def test_a_checkpoint_taken_between_inputs_resumes_exactly(docs, hf_tokenizer_dir):
    expected = reference(docs, hf_tokenizer_dir, **HF)
    pipe = build(docs, hf_tokenizer_dir)
    it = pipe.iter_training(**HF)
    head = [as_bytes(next(it)) for _ in range(7)]
    state = json.loads(json.dumps(pipe.checkpoint()))
    it.close()  # type: ignore[attr-defined]
    resumed = build(docs, hf_tokenizer_dir).restore(state)
    assert head + [as_bytes(inputs) for inputs in resumed.iter_training(**HF)] == expected


@pytest.mark.timeout(180)
def test_a_killed_engine_process_leaves_no_block_and_the_checkpoint_resumes(docs, hf_tokenizer_dir):
    expected = reference(docs, hf_tokenizer_dir, **HF)
    pipe = build(docs, hf_tokenizer_dir)
    got: list[Any] = []
    pid = 0
    with pytest.raises(EngineProcessError, match="was killed by SIGKILL"):
        for inputs in pipe.iter_training(**HF):
            got.append(inputs)  # held: their blocks are mapped here when the engine dies
            if len(got) == 5:
                engine = pipe._engine
                assert engine is not None and engine.pid is not None
                pid = engine.pid
                os.kill(pid, signal.SIGKILL)
    assert wait_gone([pid], timeout=30) == []
    assert our_segments(pid) == []
    assert 5 <= len(got) < len(expected)
    assert [as_bytes(inputs) for inputs in got] == expected[: len(got)]  # still readable
    resumed = build(docs, hf_tokenizer_dir).restore(pipe.checkpoint())
    rest = [as_bytes(inputs) for inputs in resumed.iter_training(**HF)]
    assert [as_bytes(inputs) for inputs in got] + rest == expected


def test_a_transform_and_to_training_keywords_together_are_refused(docs, hf_tokenizer_dir):
    pipe = build(docs, hf_tokenizer_dir)
    with pytest.raises(ConfigError, match="pass a transform or to_training keywords, not both"):
        pipe.iter_training(pid_of, convention="hf")
    with pytest.raises(ConfigError, match="convention must be 'shifted' or 'hf'"):
        pipe.iter_training(convention="megatron")  # before any batch is built


def test_a_transform_that_cannot_reach_the_engine_process_is_named(docs, hf_tokenizer_dir):
    lock = threading.Lock()

    def locked(batch: Any) -> Any:
        with lock:
            return batch.to_training()

    with pytest.raises(ConfigError, match=r"the transform .*locked.* cannot be sent"):
        next(iter(build(docs, hf_tokenizer_dir).iter_training(locked)))


@pytest.mark.timeout(120)
def test_an_error_building_the_inputs_reaches_the_consumer(docs, hf_tokenizer_dir):
    pipe = build(docs, hf_tokenizer_dir)
    with pytest.raises(MissingFieldError, match="extra field 'nope'"):
        for _ in pipe.iter_training(extra_fields=["nope"]):
            pass


CONSUMER = textwrap.dedent(
    """
    import sys
    from zephon import Dataset, Pipeline, StaticMixtureWorkSource

    if __name__ == "__main__":
        rows = [{"text": "row %d " % i * (1 + i % 9)} for i in range(3000)]
        source = StaticMixtureWorkSource([Dataset.from_records("r", rows)], chunk_size=64)
        pipe = (
            Pipeline(source).decode_text().tokenize("bytes").pack_flat(256, 0).batch(4)
            .options(canonical_replicas=2, queue_size=4)
        )
        it = pipe.iter_training(return_tensors="pt")
        held = [next(it) for _ in range(3)]  # mapped here, blocks of the engine process
        print("READY", pipe._engine.pid, flush=True)
        sys.stdin.readline()  # killed while it waits
    """
)


@pytest.mark.timeout(120)
def test_a_killed_consumer_leaves_no_block_its_engine_process_stops(tmp_path: Path):
    script = tmp_path / "consumer.py"
    script.write_text(CONSUMER)
    src = str(Path(zephon.__file__).resolve().parents[1])
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        env={**os.environ, "PYTHONPATH": src},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    line = proc.stdout.readline().split()
    assert line and line[0] == "READY", proc.stderr.read()
    engine = int(line[1])
    assert our_segments(engine)  # the blocks the consumer holds
    proc.kill()
    proc.communicate(timeout=30)
    assert wait_gone([engine], timeout=60) == []  # it sees the pipe close and stops
    assert our_segments(engine) == []
