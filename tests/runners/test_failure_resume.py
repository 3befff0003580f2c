"""After iteration raises, ``checkpoint()`` is the state just after the last item the consumer
received: restoring it once the cause is fixed continues exactly, under every runner."""

from __future__ import annotations

import pytest

from tests.runners._failure import fail_then_resume, faulty_stateful
from tests.runners._faulty import FailWhileArmedOp
from tests.runners._pipes import key
from zephon import Pipeline
from zephon._engine.workers.pools import WorkerCrashedError

CASES = [
    ("inline", "raise", ValueError),
    ("inline", "interrupt", KeyboardInterrupt),
    ("threads", "raise", ValueError),
    ("threads", "interrupt", KeyboardInterrupt),
    ("process", "raise", ValueError),
    ("process", "exit", WorkerCrashedError),
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("runner", "how", "error_type"), CASES)
def test_checkpoint_after_a_failure_resumes_exactly(
    tmp_path, docs, hf_tokenizer_dir, runner, how, error_type
):
    armed = tmp_path / "armed"
    many = [{**d, "id": i} for i, d in enumerate(docs * 4)]  # more than the engine buffers

    def build() -> Pipeline:
        # Any record fails while armed, and it is armed once the first batch was received: the
        # failure lands mid-run however far ahead of the consumer the workers are.
        op = FailWhileArmedOp(armed, victim=None, how=how)
        return faulty_stateful(many, hf_tokenizer_dir, op, runner, max_worker_retries=1)

    expected = [key(item) for item in build()]  # not armed: the uninterrupted run
    first, rest, error = fail_then_resume(build, armed, arm_after=1)
    assert isinstance(error, error_type)
    assert 1 <= len(first) < len(expected)
    assert first + rest == expected
