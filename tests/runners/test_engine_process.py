"""engine_process=True: the engine in a child process gives the same batches, exact checkpoints
taken in the consumer, a clear error when the child is killed, and leaves nothing behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.runners._leaks import descendants_of, our_segments, wait_gone, workers_of
from tests.runners._pipes import digest, key, reference, run_with_stops, stateful
from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.errors import ConfigError, EngineProcessError
from zephon.pipeline import Pipeline as PipelineType

SHM_ALL: dict[str, Any] = {"shm_min_bytes": 1}  # every token array through shared memory


def engine_pid(pipe: PipelineType) -> int:
    engine = pipe._engine
    assert engine is not None
    pid = getattr(engine, "pid", None)
    assert isinstance(pid, int)
    return pid


def assert_child_left_nothing(pid: int, grandchildren: list[int]) -> None:
    assert wait_gone([pid, *grandchildren], timeout=30) == []
    assert our_segments(pid) == []


@pytest.mark.timeout(120)
@pytest.mark.parametrize("runner", ["inline", "threads", "process"])
def test_batches_equal_inline_for_every_runner_in_the_child(docs, hf_tokenizer_dir, runner):
    expected = digest(reference(docs, hf_tokenizer_dir, "inline", 1))
    assert len(expected) > 40
    pipe = reference(docs, hf_tokenizer_dir, runner, 2, engine_process=True, **SHM_ALL)
    got, pid, workers = [], 0, []
    for item in pipe:
        if not got:
            pid = engine_pid(pipe)
            workers = descendants_of(pid)
            assert (len(workers_of(pid)) == 2) == (runner == "process")
        got.append(key(item))
    assert got == expected
    stats = pipe.stats()
    assert stats is not None and stats.delivered == len(expected)
    assert_child_left_nothing(pid, workers)


@pytest.mark.timeout(180)
def test_checkpoints_taken_in_the_consumer_resume_exactly(docs, hf_tokenizer_dir):
    """Packing, shuffle and flush sentinels; stopped twice, restored through JSON each time."""
    expected = digest(stateful(docs, hf_tokenizer_dir, "inline", 1))
    assert len(expected) > 20

    def build() -> Pipeline:
        return stateful(docs, hf_tokenizer_dir, "threads", 2, engine_process=True, **SHM_ALL)

    assert run_with_stops(build, [5, 13]) == expected
    # a checkpoint from the engine process restores without it, and the other way round
    plain = run_with_stops(lambda: stateful(docs, hf_tokenizer_dir, "threads", 2), [9])
    assert plain == expected


@pytest.mark.timeout(180)
def test_sigkill_of_the_engine_process_names_it_and_the_checkpoint_resumes(docs, hf_tokenizer_dir):
    expected = digest(reference(docs, hf_tokenizer_dir, "inline", 1))
    pipe = reference(docs, hf_tokenizer_dir, "process", 2, engine_process=True, **SHM_ALL)
    got: list[Any] = []
    pid, workers = 0, []
    with pytest.raises(EngineProcessError) as info:
        for item in pipe:
            got.append(key(item))
            if len(got) == 5:
                pid = engine_pid(pipe)
                workers = descendants_of(pid)
                assert len(workers_of(pid)) == 2
                os.kill(pid, signal.SIGKILL)
    message = str(info.value)
    assert f"pid {pid}) was killed by SIGKILL" in message
    assert f"after handing over {len(got)} item(s)" in message
    assert "pipeline.checkpoint()" in message and "pipe.restore(state)" in message
    assert info.value.exitcode == -signal.SIGKILL
    assert 5 <= len(got) < len(expected)  # what was already handed over still arrives
    assert_child_left_nothing(pid, workers)

    resumed = reference(docs, hf_tokenizer_dir, "process", 2, engine_process=True, **SHM_ALL)
    resumed.restore(pipe.checkpoint())
    assert got + digest(resumed) == expected


@pytest.mark.timeout(120)
def test_leaving_early_stops_the_engine_process_and_its_workers(docs, hf_tokenizer_dir):
    pipe = reference(docs, hf_tokenizer_dir, "process", 2, engine_process=True, **SHM_ALL)
    it = iter(pipe)
    next(it)
    pid = engine_pid(pipe)
    workers = descendants_of(pid)  # the forkserver and the workers it forked
    assert len(workers_of(pid)) == 2
    it.close()  # type: ignore[attr-defined]
    assert_child_left_nothing(pid, workers)


def explode(payload: dict[str, Any]) -> dict[str, Any]:
    if payload["text"] == "row 70":
        raise ValueError("row 70 is bad")
    return payload


def rows_pipe(**opts: Any) -> Pipeline:
    rows = [{"text": f"row {i}"} for i in range(200)]
    source = StaticMixtureWorkSource([Dataset.from_records("rows", rows)], chunk_size=16)
    return Pipeline(source).map_transform(explode).batch(4).options(**opts)


@pytest.mark.timeout(60)
def test_an_operator_error_in_the_engine_process_reaches_the_consumer_as_without_it():
    with pytest.raises(ValueError, match="row 70 is bad") as plain:
        for _ in rows_pipe():
            pass
    with pytest.raises(ValueError, match="row 70 is bad") as info:
        for _ in rows_pipe(engine_process=True):
            pass
    assert type(info.value) is type(plain.value)
    assert getattr(info.value, "zephon_op_name", None) == "map_transform"
    notes = "".join(getattr(info.value, "__notes__", []))
    assert "raised in operator 'map_transform'" in notes and "in explode" in notes


def stamp_environment(payload: dict[str, Any]) -> dict[str, Any]:
    return {**payload, "mark": os.environ.get("ZEPHON_TEST_ENGINE_MARK")}


@pytest.mark.timeout(60)
def test_the_engine_process_sees_the_environment_of_its_start(monkeypatch: pytest.MonkeyPatch):
    """The child is forked from a server started earlier; it must not keep that one's
    environment."""
    rows = [{"text": f"row {i}"} for i in range(20)]

    def marks() -> set[Any]:
        source = StaticMixtureWorkSource([Dataset.from_records("rows", rows)], chunk_size=8)
        pipe = Pipeline(source).map_transform(stamp_environment).options(engine_process=True)
        return {r.payload["mark"] for r in pipe}

    monkeypatch.setenv("ZEPHON_TEST_ENGINE_MARK", "first")
    assert marks() == {"first"}
    monkeypatch.setenv("ZEPHON_TEST_ENGINE_MARK", "second")
    assert marks() == {"second"}
    monkeypatch.delenv("ZEPHON_TEST_ENGINE_MARK")
    assert marks() == {None}


def test_ray_stages_are_refused_with_engine_process(tmp_path: Path):
    with pytest.raises(ConfigError, match="engine_process=True cannot run runner='ray'"):
        rows_pipe(runner="ray", engine_process=True)
    rows = [{"text": "a"}]
    source = StaticMixtureWorkSource([Dataset.from_records("rows", rows)], chunk_size=1)
    pipe = Pipeline(source).map_transform(dict, placement="remote").batch(1)
    with pytest.raises(ConfigError, match="cannot run operators on Ray"):
        iter(pipe.options(engine_process=True)).__next__()


NO_GUARD = """\
from zephon import Dataset, Pipeline, StaticMixtureWorkSource

rows = [{"text": f"doc {i}"} for i in range(200)]
source = StaticMixtureWorkSource([Dataset.from_records("d", rows)], chunk_size=32)
pipe = Pipeline(source).decode_text().batch(4).options(OPTIONS)
print(sum(1 for _ in pipe))
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("options", "named"),
    [
        ("engine_process=True", "the engine process (engine_process=True) could not start: "),
        ("lane_workers=2, canonical_replicas=2", "lane worker 0 of 2 (lanes [0]) could not start"),
    ],
)
def test_a_script_without_main_guard_gets_the_fix(tmp_path: Path, options: str, named: str):
    script = tmp_path / "train_no_guard.py"
    no_guard = NO_GUARD.replace("OPTIONS", options)
    script.write_text(no_guard)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=50, cwd=tmp_path
    )
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("zephon.errors.EngineProcessError: ")
    assert named in last
    assert f"{script} starts the pipeline when imported; put that code under `if __name__" in last
    assert "failed too" not in done.stderr  # closing what never started adds nothing
    guarded = tmp_path / "train.py"
    body = "".join(f"    {line}\n" for line in no_guard.splitlines())
    guarded.write_text(f"def main():\n{body}\n\nif __name__ == '__main__':\n    main()\n")
    done = subprocess.run(
        [sys.executable, str(guarded)], capture_output=True, text=True, timeout=50, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "50"
