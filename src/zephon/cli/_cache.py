"""``zephon cache ls`` / ``zephon cache clean``: what the node cache holds, and freeing it."""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path
from typing import Any

from zephon.cli._common import EXIT_FAILURE, EXIT_OK, fail


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "cache",
        description=(
            "The node cache holds whole remote shards (CacheOptions) and derived files (JSONL "
            "offset indexes, decompressed copies). Default folder: $ZEPHON_CACHE_DIR, else "
            "$XDG_CACHE_HOME/zephon, else ~/.cache/zephon."
        ),
    )
    sub = parser.add_subparsers(dest="cache_command", metavar="ACTION", required=True)
    ls = sub.add_parser("ls", help="list cached shards, least recently used first")
    _dir_argument(ls)
    ls.add_argument("--verify", action="store_true", help="re-hash every shard (reads them all)")
    ls.add_argument("--json", action="store_true", help="one JSON document instead of a table")
    ls.set_defaults(func=_ls)
    clean = sub.add_parser("clean", help="remove cached shards and derived files")
    _dir_argument(clean)
    clean.add_argument(
        "--max-bytes", type=int, default=None,
        help="evict least recently used shards until this many bytes remain (keeps derived files)",
    )  # fmt: skip
    clean.add_argument(
        "--corrupt", action="store_true", help="remove only shards that fail --verify"
    )
    clean.set_defaults(func=_clean)


def _dir_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dir", default=None, help="the cache folder (default: see above)")


def _cache(args: argparse.Namespace) -> Any:
    from zephon.io import CacheOptions, NodeCache, cache_root

    return NodeCache(CacheOptions(dir=cache_root(args.dir)))


def _derived_bytes(root: Path) -> int:
    folder = root / "derived"
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else 0


def _ls(args: argparse.Namespace) -> int:
    cache = _cache(args)
    entries = sorted(cache.entries(), key=lambda e: e.last_used)
    rows = [
        {
            "url": e.url,
            "bytes": e.size,
            "last_used": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e.last_used)),
            "path": str(e.path),
            **({"ok": cache.verify(e)} if args.verify else {}),
        }
        for e in entries
    ]
    derived = _derived_bytes(cache.root)
    total = sum(r["bytes"] for r in rows)
    if args.json:
        doc = {"dir": str(cache.root), "shards": rows, "shard_bytes": total}
        print(json.dumps({**doc, "derived_bytes": derived}, indent=1))
    else:
        print(f"{cache.root}: {len(rows)} shards, {total:,} bytes; derived files {derived:,} bytes")
        for r in rows:
            mark = "" if "ok" not in r else ("  ok" if r["ok"] else "  CORRUPT")
            print(f"{r['bytes']:>14,}  {r['last_used']}  {r['url']}{mark}")
    bad = [r for r in rows if r.get("ok") is False]
    return EXIT_FAILURE if bad else EXIT_OK


def _clean(args: argparse.Namespace) -> int:
    cache = _cache(args)
    if args.max_bytes is not None and args.max_bytes < 0:
        return fail("cache clean", f"--max-bytes must be >= 0, got {args.max_bytes}", 2)
    entries = sorted(cache.entries(), key=lambda e: e.last_used)
    if args.corrupt:
        doomed = [e for e in entries if not cache.verify(e)]
    else:
        keep = args.max_bytes if args.max_bytes is not None else 0
        used = sum(e.size for e in entries)
        doomed = []
        for e in entries:
            if used <= keep:
                break
            doomed.append(e)
            used -= e.size
    removed = sum(e.size for e in doomed if cache.remove(e))
    derived = 0
    if args.max_bytes is None and not args.corrupt:
        derived = _derived_bytes(cache.root)
        shutil.rmtree(cache.root / "derived", ignore_errors=True)
    print(
        f"removed {len(doomed)} shards ({removed:,} bytes) and {derived:,} bytes of derived files"
    )
    return EXIT_OK
