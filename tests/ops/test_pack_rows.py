"""pack_flat's rows of a micro-batch at once: the same rows as assembling bin by bin."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zephon._ops._pack_rows import RowLayout, assemble_rows
from zephon._ops._packing_algos import FitPacker, Limits
from zephon._ops.pack import DeferredBin, PackFlatOp
from zephon.types import SampleMeta, SampleRecord

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MAX_LENGTH = 24


def meta(i: int) -> SampleMeta:
    return SampleMeta((0, 0, i), 0, 0, i)


def describe(row):
    return [(k, v.dtype.str, v.shape, v.tobytes()) for k, v in row.items()]


@st.composite
def micro_batches(draw):
    """Bins of segments as the accumulator leaves them: each a slice of a record's fields."""
    dtype = draw(st.sampled_from(["<i4", "<i8", "|u1", ">i4"]))
    mask = draw(st.booleans())
    odd = draw(st.sampled_from(["none", "dtype", "list"]))  # a segment the bulk pass refuses
    bins = []
    for b in range(draw(st.integers(1, 6))):
        room, segments = MAX_LENGTH, []
        while room and (not segments or draw(st.booleans())):
            full = draw(st.integers(1, MAX_LENGTH))
            start = draw(st.integers(0, full - 1))
            stop = min(full, start + draw(st.integers(1, room)))
            tokens = (np.arange(full) + 100 * b + 7 * len(segments)).astype(dtype)
            fields = {"input_ids": tokens}
            if mask:
                fields["loss_mask"] = (np.arange(full) % 2).astype(np.uint8)
            segments.append((fields, start, stop, full))
            room -= stop - start
        bins.append(segments)
    if odd != "none":
        fields = bins[-1][-1][0]
        tokens = fields["input_ids"]
        fields["input_ids"] = tokens.astype(np.int16) if odd == "dtype" else tokens.tolist()
    return bins, odd, dtype


@SETTINGS
@given(
    micro_batches(),
    st.sampled_from([0, 3, 250]),
    st.booleans(),
    st.booleans(),
)
def test_rows_of_a_micro_batch_are_the_rows_assembled_bin_by_bin(
    batch, pad_token_id, positions, document_ids
):
    bins, odd, dtype = batch
    op = PackFlatOp(
        MAX_LENGTH, pad_token_id, emit_positions=positions, emit_document_ids=document_ids
    )
    expected = [op.assemble(meta(i), DeferredBin(segs)) for i, segs in enumerate(bins)]
    layout = RowLayout(MAX_LENGTH, pad_token_id, positions=positions, document_ids=document_ids)
    rows = assemble_rows(layout, bins)
    mixed = odd == "dtype" and sum(map(len, bins)) > 1  # one segment has one dtype
    if odd == "list" or mixed or dtype == ">i4":
        assert rows is None  # left to assemble, bin by bin
    else:
        assert rows is not None
        assert [describe(r) for r in rows] == [describe(r) for r in expected]
    elems = [SampleRecord(meta(i), DeferredBin(segs)) for i, segs in enumerate(bins)]
    got = op.process_many(elems)  # either way, the operator's rows are those
    assert [describe(r.payload) for r in got] == [describe(r) for r in expected]
    assert [r.meta for r in got] == [e.meta for e in elems]


def test_a_pad_id_the_dtype_cannot_hold_fails_only_where_a_row_is_padded():
    op = PackFlatOp(4, 300)
    layout = RowLayout(4, 300, positions=True, document_ids=True)
    full = [({"input_ids": np.arange(4, dtype=np.uint8)}, 0, 4, 4)]
    rows = assemble_rows(layout, [full])
    assert rows is not None and rows[0]["input_ids"].tolist() == [0, 1, 2, 3]
    padded = [({"input_ids": np.arange(4, dtype=np.uint8)}, 0, 2, 4)]
    for assemble in (
        lambda: assemble_rows(layout, [padded]),
        lambda: op.assemble(meta(0), DeferredBin(padded)),
    ):
        try:
            assemble()
        except OverflowError as exc:
            assert "300" in str(exc)
        else:
            raise AssertionError("padding uint8 rows with 300 must fail as np.full does")


def packer_run(lengths, capped: bool, restore_at: int):
    """Every closed bin of a best_fit packer as ``(opened, [(record, start, stop)])``; the
    packer is rebuilt from its saved state at ``restore_at``."""
    counts = {"images_of": lambda r: 0, "max_images_per_bin": 10**9} if capped else {}
    limits = Limits(MAX_LENGTH, 4, 2, 5, "fullest", **counts)
    packer = FitPacker(limits, best=True)
    closed = []
    for i, n in enumerate(lengths):
        if i == restore_at:
            saved = packer.state()
            packer = FitPacker(limits, best=True)
            packer.load(saved)
        closed += packer.add(i, n)
    closed += packer.drain()
    return [(b.opened, [tuple(s[:3]) for s in b.segments]) for b in closed]


@SETTINGS
@given(st.lists(st.integers(1, MAX_LENGTH), max_size=60), st.integers(0, 60))
def test_uncapped_bins_are_chosen_as_with_counted_images(lengths, restore_at):
    """The per-record path without image counts decides every bin as the counting path."""
    assert packer_run(lengths, False, restore_at) == packer_run(lengths, True, restore_at)
