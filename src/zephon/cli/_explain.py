"""``zephon explain CONFIG.yaml``: the compiled plan as text, JSON, Mermaid or Graphviz dot."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from zephon.cli._common import EXIT_OK, EXIT_USAGE, fail
from zephon.cli._report import mixture_target_line
from zephon.errors import ConfigError, ZephonError


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "explain",
        description="Validate CONFIG, list its datasets' shards and print the plan the engine "
        "would run: per operator its runner, workers, micro-batch, queue and in-flight sizes and "
        "whether it keeps cursor order; lanes, ranks and flush_every_k_chunks. Only metadata is "
        "read (listings, index.json): no shard is opened, indexed or decompressed.",
    )
    add_arguments(parser)
    parser.set_defaults(func=run)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", metavar="CONFIG.yaml", help="pipeline description")
    parser.add_argument(
        "--format", dest="fmt", choices=("text", "json", "mermaid", "dot"), default="text",
        help="text table (default), JSON, or a Mermaid / Graphviz dot diagram",
    )  # fmt: skip


def describe_datasets(config: Any) -> list[dict[str, Any]]:
    """Name, shard count, formats and rows (``None`` unless index.json says) per dataset."""
    out = []
    for d, shards in zip(config.datasets, config.list_datasets(), strict=True):
        rows = [r for _, _, r in shards]
        out.append(
            {
                "name": d.name,
                "shards": len(shards),
                "formats": sorted({f for _, f, _ in shards}),
                "rows": None if None in rows else sum(r for r in rows if r is not None),
            }
        )
    return out


def describe_mixture(config: Any, datasets: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The mixture as configured (None for one dataset): ``unit``, normalised ``weights``
    (None when they are the datasets' row counts and some are not known before the run),
    ``by`` (``weights``, ``rows`` or ``schedule``), the pinned ``tokens_per_sample`` and a
    schedule's ``phases``."""
    from zephon.work import MixtureSchedule, MixtureSpec

    if len(datasets) < 2:
        return None
    mixture = config.mixture
    out: dict[str, Any] = {"unit": "samples", "by": "weights", "tokens_per_sample": None}
    if mixture is None:
        rows = {d["name"]: d["rows"] for d in datasets}
        known = None not in rows.values() and sum(rows.values()) > 0
        out.update(by="rows", weights=_normalised(rows) if known else None)
    elif isinstance(mixture, MixtureSchedule):
        phases = [{"at": at, "weights": _normalised(w)} for at, w in mixture.phases]
        out.update(by="schedule", unit=mixture.unit, weights=phases[0]["weights"], phases=phases)
        out.update(schedule_by=mixture.by, tokens_per_sample=mixture.tokens_per_sample)
    elif isinstance(mixture, MixtureSpec):
        out.update(unit=mixture.unit, weights=dict(mixture.weights))
        out.update(tokens_per_sample=mixture.tokens_per_sample)
    else:
        out["weights"] = _normalised(mixture)
    return out


def _normalised(weights: dict[str, Any]) -> dict[str, float]:
    total = sum(float(w) for w in weights.values())
    return {k: float(w) / total for k, w in weights.items() if float(w) > 0}


def _mixture_label(mixture: dict[str, Any]) -> str:
    """``mixture by samples: web 70.0%, code 30.0% (delivered shares by samples and tokens:
    zephon run's summary, --json, metrics, checkpoint inspect)``."""
    if mixture["weights"] is None:
        head = f"mixture by {mixture['unit']}: in proportion to the datasets' rows"
    else:
        head = mixture_target_line(mixture) or ""
    if mixture["by"] == "schedule":
        head += (
            f" from 0, then {len(mixture['phases']) - 1} more phase(s) by {mixture['schedule_by']}"
        )
    if mixture["unit"] == "tokens" and mixture["tokens_per_sample"] is None:
        head += " (tokens per sample measured when the run starts)"
    return (
        f"{head}; delivered shares by samples and by tokens: zephon run's summary and --json, "
        "its metrics, zephon checkpoint inspect"
    )


def _source_label(datasets: list[dict[str, Any]]) -> str:
    parts = []
    for d in datasets:
        rows = "rows counted when run" if d["rows"] is None else f"{d['rows']:,} rows"
        parts.append(f"{d['name']} ({d['shards']} {'/'.join(d['formats'])} shards, {rows})")
    return "source: " + ", ".join(parts)


def to_mermaid(plan: Any, source_label: str) -> str:
    lines = ["flowchart LR", f'  src["{source_label}"]']
    prev = "src"
    for s in plan.stages:
        node = f"s{s.index}"
        order = "" if s.preserves_cursor_order else "<br/>reorders"
        lines.append(f'  {node}["{s.op_name}<br/>{s.runner} x{s.parallelism}{order}"]')
        lines.append(f"  {prev} --> {node}")
        prev = node
    lines.append(f'  tail["lanes {plan.lanes}<br/>round-robin"]')
    lines.append(f"  {prev} --> tail")
    return "\n".join(lines)


def to_dot(plan: Any, source_label: str) -> str:
    def q(text: str) -> str:
        return '"' + text.replace('"', '\\"') + '"'

    lines = ["digraph zephon {", "  rankdir=LR;", "  node [shape=box];"]
    lines.append(f"  src [label={q(source_label)}, shape=folder];")
    prev = "src"
    for s in plan.stages:
        node = f"s{s.index}"
        label = f"{s.op_name}\\n{s.runner} x{s.parallelism}"
        if not s.preserves_cursor_order:
            label += "\\nreorders"
        lines.append(f"  {node} [label={q(label)}];")
        lines.append(f"  {prev} -> {node} [label={q(f'queue {s.queue_size}')}];")
        prev = node
    lines.append(f"  tail [label={q(f'lanes {plan.lanes}, round-robin')}, shape=oval];")
    lines.append(f"  {prev} -> tail;")
    lines.append("}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from zephon.config import load_config

    try:
        config = load_config(args.config)
        datasets = describe_datasets(config)
        plan = config.build_unread().explain()
        mixture = describe_mixture(config, datasets)
    except ConfigError as exc:
        return fail("explain", exc, EXIT_USAGE)
    except ZephonError as exc:
        return fail("explain", f"{args.config}: {exc}", EXIT_USAGE)
    label = _source_label(datasets)
    if args.fmt == "json":
        data = plan.to_dict()
        data["datasets"] = datasets
        data["mixture"] = mixture
        print(json.dumps(data, indent=1))
    elif args.fmt == "mermaid":
        print(to_mermaid(plan, label))
    elif args.fmt == "dot":
        print(to_dot(plan, label))
    else:
        print(label)
        if mixture is not None:
            print(_mixture_label(mixture))
        print(str(plan))
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="zephon explain")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
