"""What a :class:`StaticMixtureWorkSource` checkpoint holds, and the checks on loading one.

A state is small and JSON-safe: the configuration summary and its fingerprint (a state from
another configuration is refused, naming what differs), the lane it belongs to, and the chunk
sequence's cursor. The chunk sequence itself is recomputed from the configuration. A lean state
(the lanes of a pipeline checkpoint after its first) leaves the summary out: the fingerprint
alone refuses another configuration.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import xxhash

from zephon._fingerprint import fingerprint
from zephon.errors import CheckpointError
from zephon.work._schedule import check_past

if TYPE_CHECKING:
    from zephon.io import Dataset
    from zephon.work._chunks import ChunkSequence
    from zephon.work._phased import PhasedMixture
    from zephon.work._schedule import Phase
    from zephon.work._source_options import SourceOptions

STATE_VERSION = 1
KIND = "StaticMixtureWorkSource"


def source_config(
    datasets: Sequence[Dataset], options: SourceOptions, mixture: PhasedMixture, epoch: int
) -> dict[str, Any]:
    """The configuration summary a state carries and the fingerprint hashes."""
    return {
        "datasets": [
            {
                "name": d.name,
                "rows": d.total(),
                "shards": d.shard_count(),
                "counts_hash": xxhash.xxh64_hexdigest(
                    np.asarray(d.counts(), dtype=np.int64).tobytes()
                ),
            }
            for d in datasets
        ],
        **mixture.config(),
        "chunk_size": options.chunk_size,
        "seed": options.seed,
        "shuffle_shards": options.shuffle_shards,
        "shuffle_within_shard": options.shuffle_within_shard,
        "shuffle_block_size": options.shuffle_block_size,
        "exhausted_policy": list(options.policies),
        "max_repeats": list(options.max_repeats),
        "stop_after_passes": options.stop_after_passes,
        "lane_assignment": options.lane_assignment,
        "reshuffle_on_repeat": options.reshuffle_on_repeat,
        **({"epoch": epoch} if epoch else {}),  # epoch 0 keeps old fingerprints
    }


class LaneCursor(NamedTuple):
    """Where a lane clone stands: the lane and the chunks it has emitted."""

    lane_id: int | None
    lanes: int | None
    chunks: int = 0
    done: bool = False


def state_dict(
    config: dict[str, Any], lane: LaneCursor, sequence: ChunkSequence, scheduled: bool
) -> dict[str, Any]:
    cursor = sequence.cursor()
    return {
        "version": STATE_VERSION,
        "kind": KIND,
        "fingerprint": fingerprint(config),
        "config": config,
        "lane_id": lane.lane_id,
        "canonical_replicas": lane.lanes,
        "lane_chunks": lane.chunks,
        "lane_done": lane.done,
        "global_index": cursor["global_index"],
        "positions": cursor["positions"],
        "debts": cursor["debts"],
        "active": cursor["active"],
        "done": cursor["done"],
        "phase": cursor["phase"],
        "schedule": [p.to_json() for p in sequence.phases] if scheduled else None,
    }


def load_state_dict(
    state: Any, config: dict[str, Any], lane: LaneCursor, sequence: ChunkSequence, scheduled: bool
) -> LaneCursor:
    """Check ``state`` against this configuration and lane, move ``sequence``'s cursor to it
    and return the lane's cursor; raise CheckpointError saying what does not match."""
    _check_header(state, config, lane)
    k = len(sequence.datasets)
    try:
        pos = [int(x) for x in state["positions"]]
        debts = [int(x) for x in state["debts"]]
        active = [bool(x) for x in state["active"]]
        g = int(state["global_index"])
        lane_chunks = int(state["lane_chunks"])
        done = bool(state["done"])
        lane_done = bool(state["lane_done"])
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"work-source state is corrupt: {e!r}") from e
    if len(pos) != k or len(debts) != k or len(active) != k or g < 0 or lane_chunks < 0:
        raise CheckpointError("work-source state is corrupt: per-dataset lists have wrong size")
    phase = int(state.get("phase", 0))
    phases: Sequence[Phase] = sequence.phases
    if scheduled:
        check_past(state.get("schedule"), phases, sum(pos))
    if not 0 <= phase < len(phases):
        raise CheckpointError(f"work-source state is corrupt: phase {phase} out of range")
    sequence.restore(g, pos, debts, active, done, phase)
    return lane._replace(chunks=lane_chunks, done=lane_done)


def _check_header(state: Any, config: dict[str, Any], lane: LaneCursor) -> None:
    if not isinstance(state, Mapping):
        raise CheckpointError(f"work-source state must be a dict, got {type(state).__name__}")
    version = state.get("version")
    if version != STATE_VERSION or state.get("kind") != KIND:
        raise CheckpointError(
            f"work-source state has kind={state.get('kind')!r} version={version!r}; this "
            f"zephon reads {KIND} version {STATE_VERSION}"
        )
    if state.get("fingerprint") != fingerprint(config):
        raise CheckpointError(
            "work-source state comes from a different configuration: "
            + _config_diff(state.get("config"), config)
        )
    for key, mine in (("lane_id", lane.lane_id), ("canonical_replicas", lane.lanes)):
        if state.get(key) != mine:
            raise CheckpointError(
                f"work-source state was saved with {key}={state.get(key)!r} but this source "
                f"has {key}={mine!r}; load each lane's state into that lane's clone"
            )


def _config_diff(saved: Any, current: dict[str, Any]) -> str:
    """Human-readable differences between two configuration summaries."""
    if not isinstance(saved, Mapping):
        return (
            "the state carries no configuration summary (a pipeline checkpoint keeps it in "
            "one lane only); compare the settings with the run that wrote it"
        )
    diffs = []
    absent = {"epoch": 0}  # keys left out at their default value
    for key in sorted(set(saved) | set(current)):
        a = saved.get(key, absent.get(key, "<missing>"))
        b = current.get(key, absent.get(key, "<missing>"))
        if json.dumps(a, sort_keys=True) != json.dumps(b, sort_keys=True):
            diffs.append(f"{key}: saved {a!r}, now {b!r}")
    return "; ".join(diffs) if diffs else "fingerprints differ"
