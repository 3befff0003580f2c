"""``zephon capture inspect`` (a built trajectory, loss mask highlighted) and
``zephon capture export`` (built trajectories to JSONL or Parquet).

Both are read-only by default: they open the store without creating it and read each rollout
through the store's read-only view (``peek``), so nothing is frozen or fenced and an agent that
is still running keeps writing. ``--freeze`` builds from a frozen snapshot instead (atomic and
idempotent; a rollout still being written refuses further puts afterwards).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from zephon.cli._common import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, fail

_FREEZE_HELP = "freeze each rollout first (its agent can write no more) and build that snapshot"


def register_tools(capture_subparsers: Any) -> None:
    """Add ``inspect`` and ``export`` to the ``zephon capture`` group."""
    ins = capture_subparsers.add_parser(
        "inspect",
        help="show a rollout's built trajectory with the loss mask highlighted",
        description="Read ROLLOUT in --store without changing it, build it "
        "(zephon.capture.build_rollout) and show the verdict, the calls of the chain and the "
        "token stream: generated tokens (loss mask 1) highlighted, prompt and tool tokens "
        "(loss mask 0) dimmed.",
    )
    ins.add_argument("rollout", metavar="ROLLOUT", help="the rollout id to show")
    ins.add_argument(
        "--store", required=True, metavar="URL",
        help="the capture store: file:///DIR, sqlite:///FILE, postgresql://...",
    )  # fmt: skip
    ins.add_argument(
        "--terminal-call-id", default=None, metavar="ID",
        help="build the chain that ends in this call (default: the rollout's terminal call)",
    )  # fmt: skip
    ins.add_argument(
        "--tokenizer", default=None,
        help="decode the tokens to text: 'bytes' or a tokenizer.json path (default: token ids)",
    )  # fmt: skip
    ins.add_argument(
        "--ids", action="store_true", help="show token ids even when --tokenizer is given"
    )
    ins.add_argument("--max-tokens", type=int, default=2000, help="tokens to show (2000)")
    ins.add_argument("--json", action="store_true", help="print the build as JSON")
    ins.add_argument("--freeze", action="store_true", help=_FREEZE_HELP)
    ins.set_defaults(func=_inspect)

    exp = capture_subparsers.add_parser(
        "export",
        help="export built trajectories to JSONL or Parquet",
        description="Build each rollout (read-only) and write one row per trainable rollout: "
        "rollout_id, snapshot_id, version, input_ids, loss_mask, logprobs, call_ids, "
        "prompt_len (and masked, mask_reasons). Exit code 1 when a rollout cannot be read.",
    )
    exp.add_argument("out", metavar="OUT", help="the file to write (.jsonl or .parquet)")
    exp.add_argument(
        "--rollout", dest="rollouts", action="append", default=[], metavar="ID",
        help="a rollout to export (repeatable)",
    )  # fmt: skip
    exp.add_argument(
        "--store", required=True, metavar="URL",
        help="the capture store: file:///DIR, sqlite:///FILE, postgresql://...",
    )  # fmt: skip
    exp.add_argument(
        "--format", dest="fmt", choices=("jsonl", "parquet"), default=None,
        help="output format (default: from OUT's suffix, else jsonl)",
    )  # fmt: skip
    exp.add_argument("--rollouts-file", type=Path, default=None, help="one rollout id per line")
    exp.add_argument("--all", action="store_true", help="every rollout of a file:// store")
    exp.add_argument(
        "--include-masked", action="store_true", help="also write masked rollouts (no tokens)"
    )
    exp.add_argument("--json", action="store_true", help="print a JSON summary")
    exp.add_argument("--freeze", action="store_true", help=_FREEZE_HELP)
    exp.add_argument("--quiet", action="store_true", help="no progress bar")
    exp.set_defaults(func=_export)


# --------------------------------------------------------------------------- building


def _open(url: str) -> Any:
    """A reader's client: a store that does not exist is an error, never created."""
    from zephon.capture.stores import open_store

    return open_store(url, create=False)


async def _build(
    store: Any, rollout_id: str, terminal_call_id: str | None = None, *, freeze: bool = False
) -> Any:
    """Build from the read-only view (``freeze``: from a frozen snapshot). An id nobody
    wrote is a :class:`LookupError` either way, so it is never fenced by a typo."""
    from zephon.capture.builder import build_rollout
    from zephon.capture.protocols import RolloutRetiredError

    try:
        snapshot = await store.peek(rollout_id)
    except RolloutRetiredError:
        raise  # its own type: an export counts it apart from failures
    except LookupError as exc:
        raise LookupError(f"{exc} (nothing was changed)") from None
    if freeze:
        snapshot = await store.freeze(rollout_id)
    return build_rollout(snapshot, terminal_call_id=terminal_call_id)


def build_row(built: Any) -> dict[str, Any]:
    """A rollout's build as one plain row (lists, not arrays)."""
    traj = built.trajectory
    if traj is None and built.output.main is not None:
        traj = built.output.main.to_trajectory(built.rollout_id)
    row: dict[str, Any] = {
        "rollout_id": built.rollout_id,
        "snapshot_id": built.snapshot_id,
        "version": built.version,
        "masked": built.masked,
        "mask_reasons": list(built.mask_reasons),
        "input_ids": [] if traj is None else traj.input_ids.tolist(),
        "loss_mask": [] if traj is None else traj.loss_mask.tolist(),
        "logprobs": [] if traj is None else traj.logprobs.tolist(),
        "call_ids": [] if traj is None else list(traj.call_ids),
        "prompt_len": 0 if traj is None else traj.prompt_len,
    }
    return row


def _decoder(spec: str | None) -> Callable[[list[int]], str] | None:
    """Decode a run of token ids to text: 'bytes' or a tokenizer.json (None: show ids)."""
    if spec is None:
        return None
    if spec == "bytes":

        def byte_text(ids: list[int]) -> str:
            specials = {256: "<bos>", 257: "<eos>"}
            data = bytes(t for t in ids if t < 256)
            text = data.decode("utf-8", errors="replace")
            return "".join(specials.get(t, "") for t in ids if t >= 256) + text

        return byte_text
    from tokenizers import Tokenizer, decoders, pre_tokenizers

    tok = Tokenizer.from_file(spec)
    if tok.decoder is None and isinstance(tok.pre_tokenizer, pre_tokenizers.ByteLevel):
        tok.decoder = decoders.ByteLevel()  # a byte-level BPE saved without its decoder

    def hf_text(ids: list[int]) -> str:
        return str(tok.decode(ids, skip_special_tokens=False))

    return hf_text


def _spans(ids: Sequence[int], mask: Sequence[int]) -> list[tuple[list[int], int]]:
    """Consecutive runs of tokens with the same loss mask value (decoded as one piece, so
    byte-level pieces become readable text)."""
    spans: list[tuple[list[int], int]] = []
    for tok, m in zip(ids, mask, strict=False):
        if spans and spans[-1][1] == m:
            spans[-1][0].append(tok)
        else:
            spans.append(([tok], m))
    return spans


def render(
    built: Any, row: dict[str, Any], decode: Callable[[list[int]], str] | None, limit: int
) -> Any:
    """Rich renderables: header, calls table, token stream with the loss mask highlighted."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    verdict = (
        Text("MASKED: " + ", ".join(row["mask_reasons"]), style="bold red")
        if row["masked"]
        else Text("trainable", style="bold green")
    )
    head = Text.assemble(
        ("rollout ", "bold"), row["rollout_id"],
        f"  snapshot {row['snapshot_id'][:12] or '(not frozen)'}",
        f" v{row['version']}  ", verdict,
    )  # fmt: skip
    n = len(row["input_ids"])
    gen = sum(row["loss_mask"])
    stats = Text(
        f"{n} tokens: {row['prompt_len']} root prompt, {gen} generated (loss mask 1), "
        f"{n - gen - row['prompt_len']} tool/user tokens between calls"
    )
    calls = Table(title="chain", title_justify="left")
    for col in ("#", "call id", "tool/user tokens", "generated", "mean logprob"):
        calls.add_column(col, justify="left" if col == "call id" else "right")
    main = built.output.main
    for i, link in enumerate(main.links if main is not None else []):
        lps = link.entry.generation_log_probs
        mean = f"{sum(lps) / len(lps):.3f}" if lps else "-"
        calls.add_row(
            str(i), link.call_id, str(len(link.interstitial)),
            str(len(link.entry.generation_token_ids)), mean,
        )  # fmt: skip
    stream = Text()
    for ids, mask in _spans(row["input_ids"][:limit], row["loss_mask"][:limit]):
        piece = decode(ids) if decode is not None else " ".join(map(str, ids)) + " "
        stream.append(piece, style="bold black on green" if mask else "dim")
    if n > limit:
        stream.append(f" ... ({n - limit} more tokens; --max-tokens)", style="italic")
    legend = Text.assemble(
        ("generated: loss mask 1", "bold black on green"), "   ",
        ("prompt / tool / user: loss mask 0", "dim"),
    )  # fmt: skip
    decisions = Text("\n".join(f"- {d}" for d in built.notes.decisions), style="italic")
    return Group(head, stats, calls, legend, stream, Text(""), decisions)


def _inspect(args: argparse.Namespace) -> int:
    from zephon._console import PipeConsole

    try:
        store = _open(args.store)
    except (ValueError, ImportError, OSError) as exc:
        return fail("capture inspect", exc, EXIT_USAGE)
    try:
        built = asyncio.run(_build(store, args.rollout, args.terminal_call_id, freeze=args.freeze))
    except LookupError as exc:
        return fail("capture inspect", str(exc).strip("'\""), EXIT_FAILURE)
    except (ValueError, OSError) as exc:
        return fail("capture inspect", f"rollout {args.rollout!r}: {exc}", EXIT_FAILURE)
    row = build_row(built)
    if args.json:
        row["decisions"] = list(built.notes.decisions)
        print(json.dumps(row))
        return EXIT_OK
    try:
        decode = None if args.ids else _decoder(args.tokenizer)
    except Exception as exc:
        return fail("capture inspect", f"--tokenizer {args.tokenizer}: {exc}", EXIT_USAGE)
    PipeConsole(highlight=False).print(render(built, row, decode, args.max_tokens))
    return EXIT_OK


# --------------------------------------------------------------------------- export


def list_file_store(url: str) -> list[str]:
    """Rollout ids of a file:// store (one ``<rollout_id>.log`` per rollout)."""
    parts = urlsplit(url)
    folder = Path(unquote(parts.path))
    if parts.scheme != "file":
        raise ValueError(f"--all lists file:// stores only; pass rollout ids for {url}")
    if not folder.is_dir():
        raise ValueError(f"{folder} is not a directory")
    return sorted(p.stem for p in folder.glob("*.log"))


def write_rows(rows: Sequence[dict[str, Any]], out: Path, fmt: str) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    if fmt == "jsonl":
        with open(tmp, "w", encoding="utf-8") as fh:
            for row in rows:
                fh.write(json.dumps(row) + "\n")
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        schema = pa.schema(
            [
                ("rollout_id", pa.string()),
                ("snapshot_id", pa.string()),
                ("version", pa.int64()),
                ("masked", pa.bool_()),
                ("mask_reasons", pa.list_(pa.string())),
                ("input_ids", pa.list_(pa.int64())),
                ("loss_mask", pa.list_(pa.int8())),
                ("logprobs", pa.list_(pa.float32())),
                ("call_ids", pa.list_(pa.string())),
                ("prompt_len", pa.int64()),
            ]
        )
        table = pa.Table.from_pylist(list(rows), schema=schema)
        pq.write_table(table, tmp)
    tmp.replace(out)


def _export(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from zephon._console import PipeConsole
    from zephon.capture.protocols import RolloutRetiredError

    out = Path(args.out)
    fmt = args.fmt or ("parquet" if out.suffix == ".parquet" else "jsonl")
    ids = list(args.rollouts)
    try:
        store = _open(args.store)
        if args.rollouts_file is not None:
            ids += [ln.strip() for ln in args.rollouts_file.read_text().splitlines() if ln.strip()]
        if args.all:
            ids += list_file_store(args.store)
    except (ValueError, ImportError, OSError) as exc:
        return fail("capture export", exc, EXIT_USAGE)
    ids = list(dict.fromkeys(ids))
    if not ids:
        return fail("capture export", "no rollouts: pass --rollout ID, --rollouts-file or --all", 2)
    rows, masked, retired, failed = [], [], [], []
    console = PipeConsole(stderr=True)
    progress = Progress(
        TextColumn("export"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[r]}"),
        console=console, disable=args.quiet,
    )  # fmt: skip

    async def go() -> None:
        task = progress.add_task("export", total=len(ids), r="")
        for rid in ids:
            try:
                built = await _build(store, rid, freeze=args.freeze)
            except RolloutRetiredError:
                retired.append(rid)  # consumed and retired by a trainer: nothing left to export
            except (ValueError, LookupError, OSError) as exc:
                failed.append(f"{rid}: {exc}")
            else:
                if built.masked:
                    masked.append(rid)
                if not built.masked or args.include_masked:
                    rows.append(build_row(built))
            progress.update(task, advance=1, r=rid)

    with progress:
        asyncio.run(go())
    if not rows and not failed:
        why = f"{len(retired)} retired, {len(masked)} masked"
        hint = "" if args.include_masked or not masked else " (--include-masked writes those)"
        return fail("capture export", f"nothing to export of {len(ids)} rollout(s): {why}"
                    f"{hint}; {out} was not written", EXIT_FAILURE)  # fmt: skip
    write_rows(rows, out, fmt)
    summary = {
        "out": str(out),
        "format": fmt,
        "rows": len(rows),
        "masked": masked,
        "retired": retired,
        "failed": failed,
        "tokens": sum(len(r["input_ids"]) for r in rows),
    }
    if args.json:
        print(json.dumps(summary))
    else:
        skipped = "" if args.include_masked else f", {len(masked)} masked left out"
        skipped += f", {len(retired)} retired" if retired else ""
        print(
            f"exported {len(rows)} rollout(s), {summary['tokens']} tokens to {out} ({fmt}){skipped}"
        )
    if failed:
        return fail("capture export", f"{len(failed)} rollout(s) failed: {failed[0]}", 1)
    return EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    sys.exit(EXIT_USAGE)
