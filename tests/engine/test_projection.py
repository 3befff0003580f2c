"""Payload projection: worker processes send back only what the next operator reads, and the
output stays byte for byte the inline runner's."""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import pytest

from tests.engine._sources import RangeSource
from zephon import Dataset, Pipeline
from zephon._engine.plan.projection import ProjectedOp, project_items
from zephon._ops.tokenize import TokenizeOp
from zephon.errors import MissingFieldError
from zephon.ops import BaseOp, OpTraits
from zephon.types import SampleMeta, SampleRecord, StreamItem, tombstone_meta


def _without_text(payload: dict[str, Any]) -> dict[str, Any]:
    if "text" not in payload:
        return payload
    return {k: v for k, v in payload.items() if k != "text"}


class FieldsSeen(BaseOp):
    """Emits the field names it received; declares that it reads everything but "text"."""

    name = "fields_seen"

    def input_projection(self) -> Any:
        return _without_text

    def traits(self) -> OpTraits:
        return OpTraits(preserves_cursor_order=True, runs_in_driver=True)

    def process_many(self, elems: list[StreamItem]) -> list[StreamItem]:
        return [SampleRecord(e.meta, {"fields": sorted(e.payload)}) for e in elems]


def with_extras(payload: dict[str, Any]) -> dict[str, Any]:
    """A string, a scalar, a group field and a field aligned with the tokens."""
    n = len(payload["input_ids"])
    mask = (np.arange(n) % 3 != 0).astype(np.int8)
    return {**payload, "group": "g" if n % 2 else "h", "note": "x" * n, "mask": mask}


def source(docs: list[dict[str, Any]], chunk: int = 30) -> RangeSource:
    return RangeSource([Dataset.from_records("docs", docs, shard_size=50)], chunk_size=chunk)


def fields_seen(docs: list[dict[str, Any]], tok: Any, runner: str) -> list[list[str]]:
    pipe = (
        Pipeline(source(docs[:60]))
        .decode_text(parallelism=2)
        .tokenize(tok, parallelism=2)
        .add_op(FieldsSeen())
        .options(runner=runner)
    )
    return [r.payload["fields"] for r in pipe]


@pytest.mark.timeout(120)
def test_process_workers_drop_fields_the_next_operator_does_not_read(docs, hf_tokenizer_dir):
    seen = fields_seen(docs, hf_tokenizer_dir, "process")
    assert seen and all(fields == ["id", "input_ids"] for fields in seen)


def test_threads_runner_passes_payloads_whole(docs, hf_tokenizer_dir):
    """Nothing crosses a pipe, so nothing is projected."""
    seen = fields_seen(docs, hf_tokenizer_dir, "threads")
    assert seen and all(fields == ["id", "input_ids", "text"] for fields in seen)


def packed(docs, tok, runner: str, workers: int, **pack: Any) -> Pipeline:
    return (
        Pipeline(source(docs))
        .decode_text(parallelism=workers)
        .tokenize(tok, max_length=40, parallelism=workers)
        .map_transform(with_extras, parallelism=workers)
        .pack_flat(64, 0, parallelism=workers, **pack)
        .batch(4, drop_last=False)
        .options(runner=runner, canonical_replicas=2)
    )


def digest(pipe: Pipeline) -> str:
    h = hashlib.sha256()
    for batch in pipe:
        for record in batch:
            h.update(repr(record.meta).encode())
            for name in sorted(record.payload):
                h.update(name.encode() + record.payload[name].tobytes())
    return h.hexdigest()


PACK_SETTINGS = [
    {},  # aligned "auto": the mask travels, the string and the group field do not
    {"aligned_fields": ["mask"], "homogeneity": "group", "groups": "group"},
    {"algorithm": "best_fit_wrap", "candidate_pool_size": 8},
]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("pack", PACK_SETTINGS)
def test_pack_flat_output_is_the_same_on_every_runner_and_width(pack, docs, hf_tokenizer_dir):
    reference = digest(packed(docs, hf_tokenizer_dir, "inline", 1, **pack))
    for runner, workers in [("threads", 2), ("process", 1), ("process", 2)]:
        assert digest(packed(docs, hf_tokenizer_dir, runner, workers, **pack)) == reference


@pytest.mark.timeout(120)
def test_a_missing_aligned_field_is_reported_with_all_the_record_fields(docs, hf_tokenizer_dir):
    """The projection leaves a payload it cannot handle whole: pack_flat's own error names
    every field the record has, under the process runner as inline."""
    pipe = packed(docs, hf_tokenizer_dir, "process", 2, aligned_fields=["missing"])
    with pytest.raises(MissingFieldError, match=r"no aligned field 'missing'.*'note'.*'text'"):
        list(pipe)


def test_project_items_projects_record_payloads_only():
    record = SampleRecord(_meta(0), {"id": 1, "text": "abc"})
    tomb = SampleRecord(tombstone_meta(_meta(1), reason="dropped"), None)
    same = SampleRecord(_meta(2), {"id": 2})
    out = project_items([record, tomb, same], _without_text)
    assert out[0].payload == {"id": 1} and out[0].meta is record.meta
    assert out[1] is tomb and out[2] is same  # nothing dropped: the record itself


def test_projected_op_keeps_the_inner_operators_name_traits_and_config(hf_tokenizer_dir):
    inner = TokenizeOp(hf_tokenizer_dir)
    op = ProjectedOp(inner, _without_text)
    assert op.name == inner.name
    assert op.traits() == inner.traits()
    assert op.config() == inner.config()
    assert op.take_counts() is None  # a plain operator has no fused counts
    out = op.process_many([SampleRecord(_meta(0), {"text": "hello world"})])
    assert list(out[0].payload) == ["input_ids"]


def _meta(i: int) -> SampleMeta:
    return SampleMeta((0, 0, i), 0, 0, i)


@pytest.mark.timeout(120)
def test_a_projected_fused_chain_still_reports_every_operators_counts(docs, hf_tokenizer_dir):
    """The fused counts of worker processes come back through the projection."""

    def counts(runner: str) -> dict[str, tuple[int, int, bool]]:
        pipe = packed(docs, hf_tokenizer_dir, runner, 2)
        list(pipe)
        stats = pipe.stats()
        assert stats is not None
        return {
            op.name: (op.elements_in, op.elements_out, op.worker_ns > 0) for op in stats.operators
        }

    process = counts("process")
    assert process == counts("threads")
    assert process["tokenize"][2] and process["map_transform"][2]
