"""The whole run of a :class:`StaticMixtureWorkSource`, counted before it runs.

The global chunk sequence is a pure function of the configuration, so the samples a set of
lanes will read (repeats of the faster datasets, retired ones, phase switches, the last short
chunk) follow from running the source's own quota arithmetic on a copy, without building a
pointer: stretches where no dataset can run out are allocated in one step, like a lane's skip,
so the cost is per event (a pass ending, a phase switching), not per chunk. Chunks are then
dealt to lanes block by block, as the lanes themselves deal them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from zephon.work._static import StaticMixtureWorkSource

#: Stretch asked of a batched allocation; a source whose next event is further away than this
#: (none at all) never ends.
_HORIZON = 1 << 60

#: Chunks computed one at a time (no batched stretch possible) before the count gives up:
#: a weight owed less than one sample per chunk in a very long run. No total is better than a
#: start-up that takes seconds.
_MAX_STEPS = 200_000

Run = tuple[int, int, int]
"""``(first global chunk, chunks, samples in each)``: consecutive chunks of one size."""


def chunk_runs(source: StaticMixtureWorkSource) -> list[Run] | None:
    """The global chunk sequence as runs of equal chunks; None when it has no end (or is too
    long to count one chunk at a time)."""
    if source.needs_measuring():
        return None  # phases are provisional until the pipeline measured its tokens
    sim = source.chunk_sequence()
    runs: list[Run] = []
    steps = 0
    while not sim.done:
        sim.enter_phase()
        if sim.endless():
            return None
        m = sim.safe_batch(_HORIZON)
        if m >= _HORIZON:
            return None
        g = sim.g
        if m >= 1:
            sim.advance(m)
            runs.append((g, m, sim.options.chunk_size))
            continue
        steps += 1
        if steps > _MAX_STEPS:
            return None
        before = sum(sim.pos)
        sim.step(generate=False)
        if sim.g > g:
            runs.append((g, 1, sum(sim.pos) - before))
    return runs


def _owned(
    source: StaticMixtureWorkSource, first: int, count: int, owned: set[int], lanes: int
) -> int:
    """How many of the global chunks ``first ... first + count - 1`` ``owned`` lanes get."""
    got = 0
    g, end = first, first + count
    while g < end:
        block, j = divmod(g, lanes)
        if j == 0 and end - g >= lanes:  # a whole block: one chunk per lane
            whole = (end - g) // lanes
            got += whole * len(owned)
            g += whole * lanes
            continue
        stop = min(end, (block + 1) * lanes)
        deal = source.deal(block, lanes)
        got += sum(1 for i in range(j, stop - block * lanes) if int(deal[i]) in owned)
        g = stop
    return got


def planned_samples(
    source: StaticMixtureWorkSource, lanes: Sequence[int], canonical_replicas: int
) -> int | None:
    """Samples ``lanes`` of ``canonical_replicas`` read over the whole run (None: no end)."""
    runs = chunk_runs(source)
    if runs is None:
        return None
    owned = set(lanes)
    if owned >= set(range(canonical_replicas)):
        return sum(count * size for _, count, size in runs)
    return sum(
        _owned(source, first, count, owned, canonical_replicas) * size
        for first, count, size in runs
    )
