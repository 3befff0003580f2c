"""``convert``: run the tasks on every core, record finished shards, resume where it stopped.

The manifest (``OUT/zephon-convert.json``, replaced whole after every shard) lists the
finished shards in plan order, so a conversion killed at any moment (SIGKILL, SIGTERM, a
crash) restarts with the same command, skips what the manifest lists and redoes only the
shards that were under way. Nothing in the output depends on timing or worker count: a
resumed conversion writes the same bytes as an uninterrupted one.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from zephon.checkpoints.format import fingerprint, to_jsonable
from zephon.convert._out import LOCK_NAME, TMP_MARK, Out
from zephon.convert._plan import (
    DEFAULT_DOCUMENTS_PER_SHARD,
    Plan,
    Task,
    make_plan,
    template_fingerprint,
    tokenizer_fingerprint,
)
from zephon.convert._pool import SharedTasks
from zephon.convert._shard import ConvertStopped, run_task
from zephon.errors import ConfigError
from zephon.io import Dataset
from zephon.io._converted import (
    MANIFEST_FORMAT,
    MANIFEST_NAME,
    MANIFEST_VERSION,
)

_PR_SET_PDEATHSIG = 1

__all__ = ["ConvertResult", "ConvertStopped", "convert"]


@dataclass(frozen=True)
class ConvertResult:
    """What a call did: ``converted`` shards now, ``skipped`` finished by an earlier call."""

    out: str
    shards: int
    converted: int
    skipped: int
    documents: int
    tokens: int
    dtype: str
    elapsed_s: float

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _identity(plan: Plan, documents_per_shard: int) -> dict[str, Any]:
    """What must match for an existing OUT to be resumed: operators, inputs, layout."""
    ops = [{"op": op.name, **to_jsonable(op.params)} for op in plan.config.operators]
    body = {
        "operators": ops,
        "sources": [list(s) for s in plan.sources],
        "tasks": [[t.name, t.start, t.stop] for t in plan.tasks],
        "dtype": plan.dtype,
        "documents_per_shard": documents_per_shard,
    }
    tokenizer_op = plan.config.build_on(
        [Dataset.from_records(d.name, [{}]) for d in plan.config.datasets],
        source={"shuffle_shards": False},
    ).operators()[-1]
    return {
        "format": MANIFEST_FORMAT,
        "version": MANIFEST_VERSION,
        "pipeline": fingerprint(body),
        "pipeline_file": os.path.basename(plan.file),
        "tokenizer": {
            "spec": str(to_jsonable(plan.tokenizer.params.get("tokenizer", "bytes"))),
            "fingerprint": tokenizer_fingerprint(plan.tokenizer.params.get("tokenizer", "bytes")),
        },
        "chat_template_fingerprint": template_fingerprint(tokenizer_op),
        "operator": plan.tokenizer.name,
        "dtype": plan.dtype,
        "documents_per_shard": documents_per_shard,
        "loss_mask": plan.mask_field is not None,
        "planned": len(plan.tasks),
    }


def _check_foreign(out: Out) -> None:
    """OUT must be new, empty or a conversion: nothing else is written into (or locked)."""
    if out.is_file():
        raise ConfigError(f"{out.url} is a file; zephon convert writes a folder, pick another OUT")
    names = out.names()
    # A convert killed before its first manifest landed leaves its lock and temp files only.
    if any(n != LOCK_NAME and TMP_MARK not in n for n in names) and out.manifest() is None:
        raise ConfigError(
            f"{out.url} exists and is not a zephon convert output (no {MANIFEST_NAME}); pick a "
            "new or empty OUT folder"
        )


def _open_out(out: Out, head: dict[str, Any]) -> dict[str, Any]:
    """The manifest to continue: a new one for a new or empty folder, else the folder's own
    when it was written by this same pipeline (raises naming what differs)."""
    _check_foreign(out)
    found = out.manifest()
    if found is None:
        return {**head, "complete": False, "shards": []}
    if found.get("pipeline") != head["pipeline"]:
        raise ConfigError(
            f"{out.url} holds a conversion of another pipeline or other settings (pipeline "
            f"fingerprint {found.get('pipeline')}, this one {head['pipeline']}); pick a new OUT "
            "or delete it to convert again"
        )
    return dict(found)


def _finished(out: Out, manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Shards the manifest records whose ``.idx`` is still there."""
    names = out.names()
    return {s["name"]: s for s in manifest["shards"] if f"{s['name']}.idx" in names}


_WORKER_PLAN: list[Plan] = []


def _init_worker(plan: Plan) -> None:
    """Pool workers die with the driver (a SIGKILLed convert leaves no writer behind),
    leave Ctrl-C to it and tokenize on one thread each (the pool is the parallelism)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ.setdefault("RAYON_NUM_THREADS", "1")
    _WORKER_PLAN[:] = [plan]


def _pool_task(task_out: tuple[Task, Out]) -> dict[str, Any]:
    return run_task(_WORKER_PLAN[0], *task_out)


def _results(
    plan: Plan, todo: list[Task], out: Out, workers: int, stop: Callable[[], bool]
) -> Iterator[dict[str, Any]]:
    """Manifest entries of ``todo`` as tasks finish (any order); raises ConvertStopped.
    With several workers the driver is one of them (see :class:`SharedTasks`)."""
    if workers <= 1 or len(todo) <= 1:
        for task in todo:
            if stop():
                raise ConvertStopped
            yield run_task(plan, task, out, stop)
        return
    processes = min(workers, len(todo)) - 1
    with SharedTasks(plan, todo, out, processes, _init_worker, _pool_task) as shared:
        yield from shared.results(stop)


def _manifest(
    head: dict[str, Any], done: dict[str, dict[str, Any]], order: dict[str, int]
) -> dict[str, Any]:
    """The manifest for the finished shards ``done``, in plan order (never in finishing
    order: the file must not depend on timing); totals once every shard is there."""
    shards = sorted(done.values(), key=lambda s: order[s["name"]])
    manifest = {**head, "complete": len(shards) == len(order), "shards": shards}
    if manifest["complete"]:
        manifest["documents"] = sum(s["documents"] for s in shards)
        manifest["tokens"] = sum(s["tokens"] for s in shards)
    return manifest


def convert(
    pipeline: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    workers: int | None = None,
    documents_per_shard: int = DEFAULT_DOCUMENTS_PER_SHARD,
    dtype: str = "auto",
    stop: Callable[[], bool] | None = None,
    on_shard: Callable[[dict[str, Any], int, int], None] | None = None,
    storage_options: dict[str, Any] | None = None,
) -> ConvertResult:
    """Tokenize ``pipeline``'s datasets into Megatron shards under ``out`` (see the module), a
    folder or an fsspec URL (``s3://bucket/corpus``, with ``storage_options`` for its client).

    ``workers``: processes (default: every core). ``stop()`` is polled; when it returns True
    the call ends with :class:`ConvertStopped` and the next call resumes. ``on_shard(entry,
    done, total)`` is called after each shard is recorded.
    """
    started = time.perf_counter()
    plan = make_plan(pipeline, documents_per_shard, dtype)
    head = _identity(plan, documents_per_shard)
    root = Out(out, storage_options)
    stop = stop or (lambda: False)
    _check_foreign(root)
    with root.locked():
        manifest = _open_out(root, head)
        root.clean_partials()
        done = _finished(root, manifest)
        skipped = len(done)
        order = {t.name: i for i, t in enumerate(plan.tasks)}
        todo = [t for t in plan.tasks if t.name not in done]
        converted = 0
        manifest = _manifest(head, done, order)
        root.write_manifest(manifest)
        for entry in _results(plan, todo, root, workers or os.cpu_count() or 1, stop):
            done[entry["name"]] = entry
            converted += 1
            manifest = _manifest(head, done, order)
            root.write_manifest(manifest)
            if on_shard is not None:
                on_shard(entry, len(done), len(plan.tasks))
    return ConvertResult(
        root.url,
        len(plan.tasks),
        converted,
        skipped,
        int(manifest.get("documents", 0)),
        int(manifest.get("tokens", 0)),
        plan.dtype,
        time.perf_counter() - started,
    )
