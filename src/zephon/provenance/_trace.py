"""``trace``: the batch a rank received at step N, rebuilt from the newest checkpoint before it.

Steps count delivered items from 0; ``ckpt-K.json`` (``zephon run --checkpoint-dir``) holds the
state after K items, so it resumes at step K. Tracing step N restores the newest valid
checkpoint of the rank with K <= N and runs N - K + 1 items forward (from the start when there
is none): the cost is the restore (re-reading the records its snapshot holds open) plus the
batches between, never a replay of the run.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zephon.checkpoints import CHECKPOINT_RE, checkpoint_files, load_checkpoint
from zephon.errors import CheckpointError, ConfigError
from zephon.provenance._extract import batch_provenance, content_fingerprint
from zephon.provenance._model import BatchProvenance, Segment
from zephon.provenance._origin import Origin
from zephon.types import SampleBatch, StreamItem

__all__ = ["TraceResult", "trace"]

PREVIEW_CHARS = 48


@dataclass
class TraceResult:
    """The traced item, its provenance and what it cost to get there."""

    step: int
    rank: int
    item: StreamItem
    provenance: BatchProvenance
    fingerprint: str
    restored_from: str | None
    replayed: int  # items iterated to reach the step (the traced one included)
    elapsed_s: float  # building, restoring and running to the step
    previews: list[list[str]] = field(default_factory=list)
    total_s: float = 0.0  # also stopping the pipeline and reading the previews

    def to_dict(self) -> dict[str, Any]:
        segments = self.provenance.to_dicts()
        flat = [p for row in self.previews for p in row]
        for seg, preview in zip(segments, flat, strict=False):
            seg["preview"] = preview
        return {
            "step": self.step,
            "rank": self.rank,
            "lane": self.provenance.lane,
            "fingerprint": self.fingerprint,
            "restored_from": self.restored_from,
            "replayed": self.replayed,
            "elapsed_s": round(self.elapsed_s, 3),
            "total_s": round(self.total_s, 3),
            "segments": segments,
        }


def _pipeline(spec: Any, rank: int | None, runner: str | None) -> Any:
    from zephon.pipeline import Pipeline

    if isinstance(spec, Pipeline):
        pipe = spec
    else:
        from zephon.config import load_config

        pipe = load_config(spec).build()
    if runner is not None:
        pipe.options(runner=runner)
    if rank is not None:
        world = pipe.runtime_options.dp_world_size
        if not 0 <= rank < world:
            raise ConfigError(
                f"trace: rank {rank} is outside 0..{world - 1} (options.dp_world_size={world})"
            )
        pipe.options(dp_rank=rank)
    return pipe


def _delivered(state: Mapping[str, Any]) -> int:
    return sum(int(lane.get("delivered", 0)) for lane in state.get("lanes", {}).values())


def restore_before(pipe: Any, directory: str | os.PathLike[str], step: int) -> tuple[Path, int]:
    """Restore the newest valid checkpoint of ``pipe``'s rank taken at or before ``step``;
    ``(its path, the step it resumes at)``, or ``(None, 0)`` when there is none."""
    rank = pipe.runtime_options.dp_rank
    found = []
    for path in checkpoint_files(directory):
        m = CHECKPOINT_RE.match(path.name)  # ckpt-[e<epoch>-]<items>.json
        if m and int(m.group(1) or 0) == pipe.epoch and int(m.group(2)) <= step:
            found.append((int(m.group(2)), path))
    for _, path in sorted(found, reverse=True):
        try:
            state = load_checkpoint(path)
            world = state.get("world", {})
            if "dp_rank" in world and int(world["dp_rank"]) != rank:
                continue
            pipe.restore(state)
        except (CheckpointError, ValueError, OSError):
            continue
        return path, _delivered(state)
    return None, 0  # type: ignore[return-value]


def _previews(
    origin: Origin, prov: BatchProvenance, batch: SampleBatch, pipe: Any, width: int
) -> list[list[str]]:
    """A short text per segment: its own tokens decoded with the pipeline's tokenizer, else
    (no tokenize operator, or one that cannot decode) the start of its source document."""
    tokenize = _tokenize_op(pipe)
    texts = _decoded(prov, batch, tokenize) if tokenize is not None else {}
    missing = [seg for r, s, seg in prov.segments() if (r, s) not in texts and not seg.extra]
    field = str(getattr(tokenize, "field", "text"))
    documents = _documents(origin, missing, field)
    return [
        [
            _preview(texts.get((r, s), documents.get(seg.sample_id, "")), seg, width)
            for s, seg in enumerate(row)
        ]
        for r, row in enumerate(prov)
    ]


def _decoded(
    prov: BatchProvenance, batch: SampleBatch, tokenize: Any
) -> dict[tuple[int, int], str]:
    """``(row, segment) -> text`` of each segment's span of the row's token ids."""
    field = str(getattr(tokenize, "output_field", "input_ids"))
    out: dict[tuple[int, int], str] = {}
    for r, row in enumerate(prov):
        payload = batch.records[r].payload if r < len(batch.records) else None
        ids = payload.get(field) if isinstance(payload, Mapping) else None
        if ids is None:
            continue
        for s, seg in enumerate(row):
            if seg.extra:
                continue
            text = tokenize.decode(ids[seg.start : seg.end])
            if text is None:
                return {}
            out[(r, s)] = text
    return out


def _documents(origin: Origin, segments: list[Segment], field: str) -> dict[Any, str]:
    """``sample_id -> text`` of the source documents of ``segments``, one read per shard."""
    wanted: dict[tuple[int, int], set[int]] = {}
    for seg in segments:
        wanted.setdefault(seg.sample_id[:2], set()).add(seg.sample_id[2])
    out: dict[Any, str] = {}
    for (ds, shard), indices in wanted.items():
        ordered = sorted(indices)
        read: list[Any]
        try:
            read = origin.datasets[ds].read(shard, ordered)
        except Exception as exc:  # a moved or unreadable file: say so in the table
            read = [f"<unreadable: {type(exc).__name__}>"] * len(ordered)
        out.update({(ds, shard, i): _text_of(r, field) for i, r in zip(ordered, read, strict=True)})
    return out


def _text_of(data: Any, field: str) -> str:
    if isinstance(data, str):
        return data
    text = data.get(field) if isinstance(data, Mapping) else None
    if not isinstance(text, str) and isinstance(data, Mapping):
        text = next((v for v in data.values() if isinstance(v, str)), None)
    return text if isinstance(text, str) else ""


def _preview(text: str, seg: Segment, width: int) -> str:
    """One line of at most ``width`` characters; "…" marks a piece that starts mid-document
    and a cut at the width."""
    if seg.extra:
        return ", ".join(f"{k}={v}" for k, v in sorted(seg.extra.items()))[:width]
    flat = " ".join(text.split())
    head = "…" if seg.source_start > 0 else ""
    return head + (flat if len(flat) <= width else flat[: width - 1] + "…")


def _tokenize_op(pipe: Any) -> Any:
    """The pipeline's tokenize operator (the last one), or None."""
    found = None
    for op in pipe.operators():
        if getattr(op, "name", "") == "tokenize" and hasattr(op, "decode"):
            found = op
    return found


def trace(
    pipeline: Any,
    step: int,
    *,
    rank: int | None = None,
    checkpoint_dir: str | os.PathLike[str] | None = None,
    runner: str | None = None,
    progress: bool = False,
    preview_chars: int = PREVIEW_CHARS,
) -> TraceResult:
    """The item ``rank`` received at ``step`` (0-based) of ``pipeline`` (a Pipeline or a YAML
    path), with its provenance and a text preview per segment.

    With ``checkpoint_dir`` the newest checkpoint at or before ``step`` is restored first.
    """
    if step < 0:
        raise ConfigError(f"trace: step must be >= 0, got {step}")
    start = time.perf_counter()
    pipe = _pipeline(pipeline, rank, runner)
    restored, base = (None, 0)
    if checkpoint_dir is not None:
        restored, base = restore_before(pipe, checkpoint_dir, step)
    item, reached = _run_to(pipe, step, base, progress)
    batch = item if isinstance(item, SampleBatch) else SampleBatch([item])
    origin = pipe.provenance_origin()
    prov = batch_provenance(batch, origin)
    previews = _previews(origin, prov, batch, pipe, preview_chars)
    return TraceResult(
        step=step,
        rank=pipe.runtime_options.dp_rank,
        item=item,
        provenance=prov,
        fingerprint=content_fingerprint(item),
        restored_from=str(restored) if restored is not None else None,
        replayed=step - base + 1,
        elapsed_s=reached - start,
        previews=previews,
        total_s=time.perf_counter() - start,
    )


def _run_to(pipe: Any, step: int, base: int, progress: bool) -> tuple[StreamItem, float]:
    """The item of ``step`` and when it arrived (before the pipeline is stopped)."""
    from rich.console import Console

    from zephon._progress import of_total, progress_bar

    total = step - base + 1
    bar = progress_bar(Console(stderr=True), "items", disable=not progress, transient=True)
    iterator: Iterator[StreamItem] = iter(pipe)
    delivered = base
    try:
        with bar:
            task = bar.add_task(f"trace step {step}", total=total, of=of_total(total))
            for k, item in enumerate(iterator, start=base):
                bar.update(task, completed=k - base + 1)
                delivered = k + 1
                if k == step:
                    return item, time.perf_counter()
    finally:
        close = getattr(iterator, "close", None)
        if close is not None:
            close()
    raise ConfigError(
        f"trace: the run ends before step {step} (it delivers {delivered} items on this rank)"
    )
