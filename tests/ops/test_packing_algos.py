"""The sorted best_fit packer decides every bin as the scanning one, restores included."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zephon._ops._packing_algos import FitPacker, Limits, SortedFitPacker, make_packer

SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MAX_LENGTH = 24


def closed_bins(packer_of, limits, lengths, restore_at):
    """Every bin as ``(opened, [(record, start, stop, last)])`` in closing order, drained at
    the end; at ``restore_at`` the packer is rebuilt from its saved state."""
    packer = packer_of(limits)
    out = []
    for i, n in enumerate(lengths):
        if i == restore_at:
            saved = packer.state()
            packer = packer_of(limits)
            packer.load(saved)
        out += [(b.opened, [tuple(s) for s in b.segments], b.used) for b in packer.add(i, n)]
    out += [(b.opened, [tuple(s) for s in b.segments], b.used) for b in packer.drain()]
    assert not packer.pending()
    return out, packer.state()


@SETTINGS
@given(
    st.lists(st.integers(1, MAX_LENGTH), max_size=80),
    st.integers(0, 80),
    st.sampled_from(["fifo", "fullest"]),
    st.integers(1, 6),
    st.integers(1, 8),
    st.sampled_from([None, 2, 3]),
)
def test_sorted_best_fit_closes_the_bins_the_scan_closes(
    lengths, restore_at, strategy, num_bins, min_remaining, max_sequences
):
    limits = Limits(MAX_LENGTH, num_bins, min_remaining, max_sequences, strategy)
    assert isinstance(make_packer("best_fit", limits, 8, 64), SortedFitPacker)
    scan = closed_bins(lambda lim: FitPacker(lim, best=True), limits, lengths, restore_at)
    assert closed_bins(SortedFitPacker, limits, lengths, restore_at) == scan


def test_equally_full_bins_are_taken_and_evicted_first_opened_first():
    packer = SortedFitPacker(Limits(10, 2, 1, None, "fullest"))
    assert packer.add("a", 7) == [] and packer.add("b", 7) == []
    assert [b.opened for b in packer.add("c", 3)] == [1]  # fills bin 1 or 2: the first
    assert packer.add("d", 5) == []  # bin 3
    evicted = packer.add("e", 6)  # fits neither bin 2 (7) nor 3 (5): evict the fullest
    assert [(b.opened, b.used) for b in evicted] == [(2, 7)]
    packer = SortedFitPacker(Limits(10, 2, 1, None, "fifo"))
    for record in ("a", "b"):
        packer.add(record, 6)
    assert [b.opened for b in packer.add("c", 8)] == [1]  # the oldest, though equally full


def test_capped_best_fit_keeps_the_scanning_packer():
    limits = Limits(10, 3, 1, None, "fullest", 2, lambda r: 1)
    assert type(make_packer("best_fit", limits, 8, 64)) is FitPacker
