"""``zephon checkpoint inspect FILE`` and ``zephon checkpoint diff A B``."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zephon.cli._common import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, fail
from zephon.cli._report import mixture_line

if TYPE_CHECKING:
    from zephon.checkpoints import ParsedCheckpoint


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("checkpoint")
    sub = parser.add_subparsers(dest="checkpoint_command", metavar="COMMAND")
    inspect = sub.add_parser(
        "inspect",
        help="show what a checkpoint holds: world, configuration, per-lane progress",
        description="FILE is a checkpoint JSON file, or a --checkpoint-dir of `zephon run` "
        "(its newest checkpoint is shown).",
    )
    inspect.add_argument("file", metavar="FILE", help="checkpoint file or checkpoint folder")
    inspect.add_argument("--json", action="store_true", help="print the summary as JSON")
    inspect.set_defaults(func=_inspect)
    diff = sub.add_parser(
        "diff",
        help="name the first difference between two checkpoints and compare lane progress",
        description="Exit code 0 when A and B are identical, 1 when they differ, 2 when one "
        "cannot be read (like diff(1)).",
    )
    diff.add_argument("a", metavar="A", help="checkpoint file or folder")
    diff.add_argument("b", metavar="B", help="checkpoint file or folder to compare with A")
    diff.add_argument("--json", action="store_true", help="print the comparison as JSON")
    diff.set_defaults(func=_diff)
    parser.set_defaults(func=lambda _args: parser.print_help() or EXIT_USAGE)


class _Unreadable(Exception):
    pass


def load(path_text: str) -> tuple[Path, dict[str, Any], ParsedCheckpoint, list[tuple[Path, str]]]:
    """Read and check a checkpoint file, or the newest valid one of a checkpoint directory.

    Returns the path, the raw state, the parsed state and the newer files of the directory
    that were refused (with the reason).
    """
    from zephon.checkpoints import latest_checkpoint, load_checkpoint, parse_checkpoint
    from zephon.errors import CheckpointError

    path = Path(path_text)
    rejected: list[tuple[Path, str]] = []
    try:
        if path.is_dir():
            latest = latest_checkpoint(path)
            if latest is None:
                raise _Unreadable(f"{path} holds no ckpt-*.json checkpoint")
            path, raw, rejected = latest.path, latest.state, latest.rejected
        else:
            raw = load_checkpoint(path)
    except CheckpointError as exc:
        raise _Unreadable(str(exc)) from None
    return path, raw, parse_checkpoint(raw), rejected


def _cursor(value: Any) -> str:
    if value is None:
        return "-"
    chunk, offset, lineage, _sid = value
    return f"{chunk}:{offset}" + ("/" + ".".join(map(str, lineage)) if lineage else "")


def _later_pass(lane: dict[str, Any], epoch: int) -> str:
    """A running lane's ``done`` cell: ``no``, or the later pass it is in (format version 6)."""
    return "no" if lane["epoch"] == epoch else f"in epoch {lane['epoch']}"


def summary(path: Path, parsed: ParsedCheckpoint) -> dict[str, Any]:
    """What ``inspect`` shows (and prints with ``--json``) of a checked checkpoint."""
    from zephon.checkpoints import refetch_counts
    from zephon.checkpoints.format import FORMAT, cursor_to_json

    refetch = refetch_counts(parsed)
    lanes = [
        {
            "lane": lane,
            "delivered": lc.delivered,
            "restart_chunk": lc.start_chunk_id,
            "restart_offset": lc.start_offset,
            "refetch": refetch[lane],
            "replay_cursor": cursor_to_json(lc.replay_cursor),
            "done": lc.done,
            "epoch": parsed.lane_epoch(lane),
        }
        for lane, lc in sorted(parsed.lanes.items())
    ]
    return {
        "file": str(path),
        "bytes": os.path.getsize(path),
        "format": FORMAT,
        "version": parsed.version,
        "fingerprint": parsed.fingerprint,
        "valid": True,
        "checksum": parsed.checksum,
        "world": dict(parsed.world),
        "canonical_replicas": parsed.canonical_replicas,
        "flush_every_k_chunks": parsed.flush_every_k_chunks,
        "epoch": parsed.epoch,
        "source": {
            "type": parsed.source.type,
            "fingerprint": parsed.source.fingerprint,
            "datasets": list(parsed.source.datasets),
        },
        "operators": [op.name for op in parsed.operators],
        "operator_state": _state_sizes(parsed),
        "delivered": parsed.delivered,
        "lanes": lanes,
        "tail": {"lanes": parsed.tail_lanes, "order": parsed.tail_order, "turn": parsed.tail_turn},
        "mixture": _mixture(parsed),
    }


def _mixture(parsed: ParsedCheckpoint) -> dict[str, Any] | None:
    """The mixture's target and the samples and tokens its lanes delivered in this pass (None
    for a checkpoint that recorded no mixture: one dataset, or written by an older zephon)."""
    from zephon.work import MixtureStats

    if parsed.mixture is None:
        return None
    target = MixtureStats.from_target_json(parsed.mixture)
    counts = parsed.delivered_mixture()
    return (target if counts is None else target.counted(*counts)).to_dict()


def _state_sizes(parsed: ParsedCheckpoint) -> list[dict[str, Any]]:
    """Bytes of saved accumulator state per operator, over every lane of the checkpoint."""
    names = [op.name for op in parsed.operators]
    sizes: dict[int, int] = {}
    for lane in parsed.lanes.values():
        for key, state in (lane.operator_state or {}).items():
            sizes[int(key)] = sizes.get(int(key), 0) + len(json.dumps(state))
    return [
        {"index": index, "operator": names[index] if index < len(names) else "?", "bytes": size}
        for index, size in sorted(sizes.items())
    ]


def _inspect(args: argparse.Namespace) -> int:
    from rich.table import Table

    from zephon._console import PipeConsole

    try:
        path, _raw, parsed, rejected = load(args.file)
    except _Unreadable as exc:
        return fail("checkpoint inspect", f"invalid checkpoint: {exc}", EXIT_USAGE)
    info = summary(path, parsed)
    info["rejected"] = [{"file": str(p), "reason": reason} for p, reason in rejected]
    if args.json:
        print(json.dumps(info, indent=1))
        return EXIT_OK
    console = PipeConsole(highlight=False)
    for bad in info["rejected"]:
        console.print(f"invalid, skipped: {bad['reason']}", markup=False)
    console.print(f"[bold]{info['file']}[/] ({info['bytes']:,} bytes)")
    check = f"checksum {info['checksum']} ok" if info["checksum"] else "no checksum (version 1)"
    console.print(f"valid: {check}")
    console.print(f"format {info['format']} v{info['version']}, fingerprint {info['fingerprint']}")
    world = " ".join(f"{k}={v}" for k, v in info["world"].items())
    console.print(f"world: {world}")
    datasets = ", ".join(
        f"{d.get('name')} ({d.get('rows', '?'):,} rows)" if isinstance(d, dict) else str(d)
        for d in info["source"]["datasets"] or []
    )
    console.print(f"source: {info['source']['type']} [{datasets}]", markup=False)
    console.print("operators: " + " -> ".join(str(o) for o in info["operators"]))
    console.print(f"flush_every_k_chunks: {info['flush_every_k_chunks']}")
    console.print(f"epoch: {info['epoch']}")
    mixture = mixture_line(info["mixture"])
    if mixture is not None:
        console.print(mixture, markup=False, soft_wrap=True)
    for saved in info["operator_state"]:
        console.print(
            f"operator state: {saved['operator']} (operator {saved['index']}): "
            f"{saved['bytes']:,} bytes over all lanes"
        )
    table = Table(title=f"lanes ({info['delivered']:,} items delivered)")
    for col in ("lane", "delivered", "restart", "re-fetch", "last cursor", "done"):
        table.add_column(col, justify="right")
    for lane in info["lanes"]:
        table.add_row(
            str(lane["lane"]),
            f"{lane['delivered']:,}",
            f"{lane['restart_chunk']}:{lane['restart_offset']}",
            f"{lane['refetch']:,}",
            _cursor(lane["replay_cursor"]),
            "yes" if lane["done"] else _later_pass(lane, info["epoch"]),
        )
    console.print(table)
    for line in LANE_LEGEND:
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    tail = info["tail"]
    console.print(f"tail: lanes {tail['lanes']}, next turn {tail['turn']}")
    console.print(
        "(the consumer takes items from the lanes round-robin in this order; "
        "next turn is the position whose lane delivers the next item)",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    return EXIT_OK


#: What the lane table's columns mean (printed under it).
LANE_LEGEND = (
    "delivered: items this lane handed to the consumer; restart: CHUNK:OFFSET a restore "
    "regenerates this lane from (its newest delivered snapshot, or the last flush);",
    "re-fetch: source records a restore reads again to rebuild the open state the snapshot "
    "names (pack bins, shuffle and mixture buffers);",
    "last cursor: CHUNK:OFFSET of the last record delivered (OFFSET its position in the chunk; "
    "/N.M after it: which derived record, e.g. a chat turn); done: the lane has no data left",
)


def first_difference(a: Any, b: Any, path: str = "") -> tuple[str, Any, Any] | None:
    """The first place two JSON values differ: (key path, value in A, value in B)."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b), key=str):
            where = f"{path}.{key}" if path else str(key)
            if key not in a or key not in b:
                return where, a.get(key, "<absent>"), b.get(key, "<absent>")
            found = first_difference(a[key], b[key], where)
            if found:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list):
        for i, (x, y) in enumerate(zip(a, b)):
            found = first_difference(x, y, f"{path}[{i}]")
            if found:
                return found
        if len(a) != len(b):
            return f"{path} (length)", len(a), len(b)
        return None
    return None if a == b else (path, a, b)


def _lane_row(key: str, la: dict[str, Any] | None, lb: dict[str, Any] | None) -> dict[str, Any]:
    """One lane of A next to the same lane of B (None where a checkpoint lacks it)."""

    def of(lane: dict[str, Any] | None, field: str) -> Any:
        return lane[field] if lane else None

    return {
        "lane": int(key),
        "a_delivered": of(la, "delivered"),
        "b_delivered": of(lb, "delivered"),
        "delta": lb["delivered"] - la["delivered"] if la and lb else None,
        "a_restart_chunk": of(la, "start_chunk_id"),
        "b_restart_chunk": of(lb, "start_chunk_id"),
        "a_done": of(la, "done"),
        "b_done": of(lb, "done"),
    }


def _verdict(first: Any, config: Any, deltas: list[int]) -> str:
    if first is None:
        return "identical"
    if config is not None:
        return "different configurations: B cannot resume a run of A"
    if deltas and all(d >= 0 for d in deltas):
        return f"same configuration; B is {sum(deltas):,} items ahead of A"
    if deltas and all(d <= 0 for d in deltas):
        return f"same configuration; B is {-sum(deltas):,} items behind A"
    return "same configuration; lanes moved in both directions"


def _shown(found: tuple[str, Any, Any] | None) -> dict[str, Any] | None:
    if found is None:
        return None
    return {"key": found[0], "a": found[1], "b": found[2]}


def compare(raw_a: dict[str, Any], raw_b: dict[str, Any]) -> dict[str, Any]:
    """Configuration, world and per-lane comparison of two checkpoints."""
    config = first_difference(raw_a["config"], raw_b["config"], "config")
    world = first_difference(raw_a["world"], raw_b["world"], "world")
    derived = ("fingerprint", "checksum", "run")  # follow from the rest, or not the pipeline's
    first = first_difference(
        {k: v for k, v in raw_a.items() if k not in derived},
        {k: v for k, v in raw_b.items() if k not in derived},
    )
    keys = sorted(set(raw_a["lanes"]) | set(raw_b["lanes"]), key=int)
    lanes = [_lane_row(k, raw_a["lanes"].get(k), raw_b["lanes"].get(k)) for k in keys]
    deltas = [lane["delta"] for lane in lanes if lane["delta"] is not None]
    return {
        "identical": first is None,
        "verdict": _verdict(first, config, deltas),
        "first_difference": _shown(first),
        "config_difference": _shown(config),
        "world_difference": _shown(world),
        "lanes": lanes,
    }


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _diff(args: argparse.Namespace) -> int:
    from rich.table import Table

    from zephon._console import PipeConsole

    try:
        path_a, raw_a, _, _ = load(args.a)
        path_b, raw_b, _, _ = load(args.b)
    except _Unreadable as exc:
        return fail("checkpoint diff", exc, EXIT_USAGE)
    result = compare(raw_a, raw_b)
    result["a"], result["b"] = str(path_a), str(path_b)
    if args.json:
        print(json.dumps(result, indent=1))
        return EXIT_OK if result["identical"] else EXIT_FAILURE
    console = PipeConsole(highlight=False)
    console.print(f"A: {path_a}\nB: {path_b}")
    first = result["first_difference"]
    if first is None:
        console.print("identical")
        return EXIT_OK
    console.print(
        f"first difference: {first['key']}: A has {_short(first['a'])}, B has {_short(first['b'])}",
        markup=False,
    )
    console.print(result["verdict"])
    table = Table(title="per-lane progress")
    for col in (
        "lane",
        "A delivered",
        "B delivered",
        "B - A",
        "A restart",
        "B restart",
        "done A/B",
    ):
        table.add_column(col, justify="right")

    def cell(v: Any) -> str:
        if v is None:
            return "-"
        return f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else str(v)

    for lane in result["lanes"]:
        done = f"{cell(lane['a_done'])}/{cell(lane['b_done'])}"
        table.add_row(
            str(lane["lane"]),
            cell(lane["a_delivered"]),
            cell(lane["b_delivered"]),
            cell(lane["delta"]),
            cell(lane["a_restart_chunk"]),
            cell(lane["b_restart_chunk"]),
            done,
        )
    console.print(table)
    return EXIT_FAILURE


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="zephon")
    register(parser.add_subparsers(dest="command", metavar="COMMAND"))
    args = parser.parse_args(["checkpoint", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
