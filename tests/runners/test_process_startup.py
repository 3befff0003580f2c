"""Worker processes that cannot start fail fast with one message naming the cause."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import types
from pathlib import Path
from typing import Any

import pytest

from tests.engine._sources import RangeSource
from zephon import Dataset, Pipeline
from zephon.errors import ConfigError
from zephon.ops import BaseOp, OpTraits

NO_GUARD = """\
from zephon import Dataset, Pipeline, MixtureSpec, StaticMixtureWorkSource

rows = [{"text": f"doc {i}"} for i in range(200)]
source = StaticMixtureWorkSource(
    datasets=[Dataset.from_records("d", rows)], mixture=MixtureSpec({"d": 1.0}),
    chunk_size=32, seed=0,
)
pipe = Pipeline(source).decode_text().tokenize("bytes").batch(4).options(runner="process")
print(sum(1 for _ in pipe))
"""


# operators far larger than a pipe buffer: the spawn launch must not block on them
BIG_OPERATOR = NO_GUARD.replace(
    '.tokenize("bytes")',
    '.tokenize("bytes").map_transform(functools.partial(keep, ballast=b"x" * 4_000_000))',
).replace("from zephon", "import functools\n\ndef keep(p, ballast):\n    return p\n\nfrom zephon")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("text", [NO_GUARD, BIG_OPERATOR], ids=["small", "big-operator"])
def test_a_script_without_main_guard_fails_at_once_with_the_fix(tmp_path: Path, text: str):
    script = tmp_path / "train_no_guard.py"
    script.write_text(text)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=50, cwd=tmp_path
    )
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("zephon._engine.workers.pools.WorkerStartError: ")
    assert f'{script} under `if __name__ == "__main__":`' in last
    # only the parent's own traceback: no worker printed anything, nothing was retried
    assert done.stderr.count("Traceback (most recent call last)") == 1
    assert "retrying" not in done.stderr


def test_the_same_script_with_a_guard_runs(tmp_path: Path):
    script = tmp_path / "train.py"
    body = textwrap.indent(NO_GUARD, "    ")
    script.write_text(f"def main():\n{body}\n\nif __name__ == '__main__':\n    main()\n")
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=50, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "50"


class HoldsALock(BaseOp):
    name = "holds_a_lock"

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()

    def traits(self) -> OpTraits:
        return OpTraits(preserves_cursor_order=True, parallelism=2)

    def process_many(self, elems: list[Any]) -> list[Any]:
        return elems


def small_pipe(op: BaseOp) -> Pipeline:
    ds = Dataset.from_records("docs", [{"id": i} for i in range(40)], shard_size=10)
    return Pipeline(RangeSource([ds], chunk_size=10)).add_op(op).options(runner="process")


@pytest.mark.timeout(60)
def test_an_unpicklable_operator_is_named():
    with pytest.raises(ConfigError) as info:
        list(small_pipe(HoldsALock()))
    message = str(info.value)
    assert "operator 'holds_a_lock' cannot be sent to worker processes" in message
    assert "lock" in message and "setup()" in message


PHANTOM = """
from zephon.ops import BaseOp, OpTraits

class PhantomOp(BaseOp):
    name = "phantom"

    def traits(self):
        return OpTraits(preserves_cursor_order=True, parallelism=2)

    def process_many(self, elems):
        return elems
"""


@pytest.mark.timeout(60)
def test_an_operator_whose_module_workers_cannot_import_is_named():
    # A module that exists only in this process: workers fail to import it when they load
    # the operator, which is reported (once) with the operator's name.
    module = types.ModuleType("zephon_tests_phantom_module")
    exec(PHANTOM, module.__dict__)
    sys.modules[module.__name__] = module
    try:
        with pytest.raises(ModuleNotFoundError, match="zephon_tests_phantom_module") as info:
            list(small_pipe(module.PhantomOp()))
    finally:
        del sys.modules[module.__name__]
    assert getattr(info.value, "zephon_op_name", None) == "phantom"
