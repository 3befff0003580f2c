"""Prove an operator the way zephon proves its own: ``check_operator(build)``.

``build()`` returns a fresh :class:`~zephon.Pipeline` that ends in the operator under test.
The check runs it under every runner and worker count, stops and restores it at many points
(through JSON), resumes it on other rank counts, and probes the operator contract directly:
the reset contract at flushes, ``process_many`` keeping nothing across calls, picklability for
the process runner, no latency bound when ``deterministic`` is set, and a configuration
fingerprint that sees every constructor argument. The first property that fails raises
:class:`OperatorCheckError`, which says which property, at which step, and the usual cause.

Importable without pytest: call it from any test framework, or from a script.
"""

from __future__ import annotations

import copy
import inspect
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import cloudpickle

from zephon._engine.plan.runner_traits import REFERENCE, REGISTRY, available
from zephon.checkpoints import merge_checkpoints
from zephon.errors import ConfigError, ContractError, ZephonError
from zephon.ops import BaseOp, OpContext
from zephon.pipeline import Pipeline
from zephon.types import SampleBatch, StreamItem, is_control

__all__ = ["CheckReport", "OperatorCheckError", "check_operator", "item_key", "run_with_stops"]

Key = Callable[[StreamItem], Any]


class OperatorCheckError(AssertionError):
    """An operator failed a property of the operator contract."""

    def __init__(self, prop: str, what: str, cause: str) -> None:
        super().__init__(f"{prop}: {what}. Usual cause: {cause}")
        self.property = prop
        self.what = what
        self.cause = cause


@dataclass
class CheckReport:
    """What :func:`check_operator` ran (every entry passed)."""

    operator: str
    items: int
    passed: list[str] = field(default_factory=list)


def _describe(value: Any) -> Any:
    """A comparable, exact description of a payload (numpy arrays by dtype, shape and bytes)."""
    tobytes = getattr(value, "tobytes", None)
    if tobytes is not None and hasattr(value, "dtype"):
        return ("array", str(value.dtype), tuple(value.shape), tobytes())
    if isinstance(value, dict):
        return tuple(sorted((str(k), _describe(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_describe(v) for v in value)
    return value


def item_key(item: StreamItem) -> Any:
    """Lane, cursor, sample ids and payload of an output item: what equality means here."""
    records = item.records if isinstance(item, SampleBatch) else [item]
    return tuple(
        (r.meta.lane_id, tuple(r.meta.cursor), tuple(r.meta.sample_id), _describe(r.payload))
        for r in records
    )


def _run(pipe: Pipeline, key: Key) -> list[Any]:
    return [key(item) for item in pipe]


def _first_difference(expected: Sequence[Any], got: Sequence[Any]) -> str:
    for i, (a, b) in enumerate(zip(expected, got, strict=False)):
        if a != b:
            return f"item {i} differs"
    return f"{len(got)} items instead of {len(expected)}"


def run_with_stops(
    build: Callable[[], Pipeline],
    key: Key,
    stops: Sequence[int],
    *,
    held_records: bool = False,
) -> list[Any]:
    """Items delivered when stopped after each count in ``stops``, checkpointed through JSON
    (``checkpoint(held_records=...)``) and restored in a freshly built pipeline each time. A
    stop at a count already delivered (0 first of all) checkpoints a pipeline that was never
    iterated."""
    out: list[Any] = []
    state = None
    for stop in [*stops, None]:
        pipe = build()
        if state is not None:
            pipe.restore(json.loads(json.dumps(state)))
        if stop is not None and len(out) >= stop:
            state = pipe.checkpoint(held_records=held_records)
            continue
        it: Iterator[StreamItem] = iter(pipe)
        for item in it:
            out.append(key(item))
            if stop is not None and len(out) >= stop:
                break
        state = pipe.checkpoint(held_records=held_records)
        it.close()  # type: ignore[attr-defined]
    return out


class _Checker:
    def __init__(
        self,
        build: Callable[[], Pipeline],
        key: Key,
        runners: Sequence[str],
        workers: Sequence[int],
    ) -> None:
        self.build = build
        self.key = key
        self.runners = runners
        self.workers = workers
        probe = build()
        self.op: BaseOp = probe.operators()[-1]
        self.report = CheckReport(self.op.name, 0)

    def variant(self, runner: str, workers: int = 1, **options: Any) -> Pipeline:
        pipe = self.build()
        pipe._override_last_parallelism(workers)
        return pipe.options(runner=runner, **options)

    def reference(self) -> list[Any]:
        try:
            expected = _run(self.variant(REFERENCE), self.key)
        except ContractError as exc:
            raise OperatorCheckError(
                "contract", f"the inline run raised ContractError: {exc}", _CONTRACT_CAUSE
            ) from exc
        self.report.items = len(expected)
        self.report.passed.append("inline run")
        return expected

    def runner_equality(self, expected: list[Any]) -> None:
        for runner in self.runners:
            if runner == REFERENCE:
                continue
            for workers in REGISTRY[runner].check_widths(self.workers):
                got = _run(self.variant(runner, workers), self.key)
                if got != expected:
                    raise OperatorCheckError(
                        "runner equality",
                        f"runner={runner!r} with {workers} worker(s) gives other output than "
                        f"{REFERENCE} ({_first_difference(expected, got)})",
                        "process_many depends on state kept across calls or on which worker "
                        "runs it, or randomness not derived from the records' cursors and a seed",
                    )
                self.report.passed.append(f"{runner} x{workers} equals {REFERENCE}")

    def stop_and_restore(self, expected: list[Any], stops: Sequence[int]) -> None:
        def build() -> Pipeline:
            return self.variant(REFERENCE)

        plans = [[s] for s in stops] + [[stops[len(stops) // 2], stops[len(stops) // 2] + 1]]
        for plan in plans:
            got = run_with_stops(build, self.key, plan)
            if got != expected:
                where = " then ".join(str(s) for s in plan)
                raise OperatorCheckError(
                    "stop and restore",
                    f"stopped after {where} item(s), checkpointed and restored, the run "
                    f"continues differently ({_first_difference(expected, got)})",
                    "the accumulator keeps state across chunks (a seen set, counters) without "
                    "state_dict/load_state_dict, or the operator is not deterministic",
                )
        self.report.passed.append(f"stop and restore at {len(plans)} points")

    def lane_keys(self, pipe: Pipeline, limit: int | None = None) -> list[tuple[int, Any]]:
        out = []
        it: Iterator[StreamItem] = iter(pipe)
        for item in it:
            out.append((_lane_of(item), self.key(item)))
            if limit is not None and len(out) >= limit:
                break
        it.close()  # type: ignore[attr-defined]
        return out

    def elastic(self, stop: int) -> None:
        expected_lanes = _lanes(self.lane_keys(self.variant(REFERENCE, canonical_replicas=4)))
        states, before = [], []
        for rank in range(2):
            pipe = self.variant(REFERENCE, canonical_replicas=4, dp_rank=rank, dp_world_size=2)
            before.extend(self.lane_keys(pipe, stop))
            states.append(pipe.checkpoint())
        merged = json.loads(json.dumps(merge_checkpoints(states)))
        for world in (1, 4):
            after = []
            for rank in range(world):
                pipe = self.variant(REFERENCE, canonical_replicas=4, dp_rank=rank,
                                    dp_world_size=world)  # fmt: skip
                after.extend(self.lane_keys(pipe.restore(merged)))
            if _lanes(before + after) != expected_lanes:
                raise OperatorCheckError(
                    "elastic resume",
                    f"checkpointed on 2 ranks after {stop} items each and resumed on {world}, "
                    "a lane's stream differs from the uninterrupted run",
                    "state shared between lanes, or lane state not saved with state_dict",
                )
        self.report.passed.append("elastic resume 2 -> 1 and 2 -> 4 ranks")


_CONTRACT_CAUSE = (
    "flush(reset=True, lane_id=L) must emit everything buffered for lane L, leave it as fresh "
    "as a new accumulator and touch no other lane"
)


def _lane_of(item: StreamItem) -> int:
    return item.lane_id if isinstance(item, SampleBatch) else item.meta.lane_id


def _lanes(pairs: list[tuple[int, Any]]) -> dict[int, list[Any]]:
    streams: dict[int, list[Any]] = {}
    for lane, key in pairs:
        streams.setdefault(lane, []).append(key)
    return streams


def _check_reset_contract(checker: _Checker) -> None:
    """Flush sentinels after every chunk make every lane flush often; nothing may break."""
    try:
        for _ in checker.variant(REFERENCE, flush_every_k_chunks=1):
            pass
    except ContractError as exc:
        raise OperatorCheckError(
            "reset contract", f"with a flush sentinel after every chunk: {exc}", _CONTRACT_CAUSE
        ) from exc
    checker.report.passed.append("reset contract at sentinels and at the end of each lane")


def _micro_batches(checker: _Checker) -> list[list[StreamItem]]:
    """The micro-batches the operator's accumulator cuts from its real upstream input."""
    upstream = checker.build()
    upstream._drop_last_op()
    inputs = [item for item in upstream.options(runner=REFERENCE) if not is_control(item)]
    ctx = OpContext(op_name=checker.op.name, op_index=0)
    acc = copy.deepcopy(checker.op).accumulator(deterministic=True, ctx=ctx)
    batches = acc.push_many(inputs[:1])  # a partial micro-batch: no deadline may be set
    deadline = acc.next_deadline_ns()
    batches += acc.push_many(inputs[1:]) + acc.flush(reset=False, lane_id=None)
    if deadline is not None:
        raise OperatorCheckError(
            "deterministic flag",
            "the accumulator made with deterministic=True has a latency deadline",
            "a max_latency_ms passed to the accumulator regardless of `deterministic`; pass "
            "None when it is True (micro-batch boundaries must not depend on the clock)",
        )
    checker.report.passed.append("no latency bound when deterministic")
    return [[e for e in mb if not is_control(e)] for mb in batches]


def _process(op: BaseOp, batches: Sequence[list[StreamItem]]) -> list[list[Any]]:
    return [[item_key(x) for x in op.process_many(list(mb))] for mb in batches]


def _check_stateless(checker: _Checker) -> None:
    """The same micro-batches give the same output in any order, on one copy or on many."""
    batches = [mb for mb in _micro_batches(checker) if mb]
    ctx = OpContext(op_name=checker.op.name, op_index=0)

    def fresh() -> BaseOp:
        op = copy.deepcopy(checker.op)
        op.setup(ctx)
        return op

    one_copy = _process(fresh(), batches)
    reversed_order = _process(fresh(), batches[::-1])[::-1]
    copies = [_process(fresh(), [mb])[0] for mb in batches]
    if not one_copy == reversed_order == copies:
        raise OperatorCheckError(
            "stateless process_many",
            f"over {len(batches)} micro-batches, the output depends on which copy of the "
            "operator runs them or in which order",
            "process_many writes to self (a counter, a cache that changes results, an RNG); "
            "move that state into the accumulator, keyed by lane",
        )
    checker.report.passed.append("process_many keeps nothing across calls")


def _check_pickle(checker: _Checker) -> None:
    try:
        clone = cloudpickle.loads(cloudpickle.dumps(checker.op))
    except Exception as exc:
        raise OperatorCheckError(
            "picklable",
            f"cloudpickle cannot send operator {checker.op.name!r} to a process: {exc}",
            "a lock, open file, socket or generator in an attribute; create it in setup()",
        ) from exc
    if clone.config() != checker.op.config():
        raise OperatorCheckError(
            "picklable",
            "the unpickled copy has another config()",
            "config() reads something that does not survive pickling",
        )
    checker.report.passed.append("picklable for the process runner")


def _check_fingerprint(checker: _Checker) -> None:
    """Every constructor argument must be in config(), or a changed value restores silently."""
    op = checker.op
    described = set(op.config())
    excluded = set(getattr(op, "config_exclude", ())) | set(getattr(op, "config_when_set", ()))
    for name, param in inspect.signature(type(op).__init__).parameters.items():
        if name in ("self", "name") or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if name not in described and name not in excluded:
            raise OperatorCheckError(
                "fingerprint",
                f"constructor argument {name!r} of {type(op).__name__} is not in config(), so "
                "a restore with another value would not be refused",
                "a config() override that leaves it out: add it (BaseOp's default config() "
                "describes every constructor argument), or list it in config_exclude if it "
                "cannot change the output",
            )
    checker.report.passed.append("every constructor argument is in the fingerprint")


def check_operator(
    build: Callable[[], Pipeline],
    *,
    key: Key = item_key,
    runners: Sequence[str] | None = None,
    workers: Sequence[int] = (1, 2, 4),
    stops: Sequence[int] | None = None,
    elastic: bool = True,
) -> CheckReport:
    """Run every check on the pipeline's last operator; raise :class:`OperatorCheckError`.

    ``runners``: default every registered runner whose needs are installed (inline, threads,
    process, and ray with ``zephon[ray]``). ``workers``: the threads runner's worker counts
    (the others run with 2). ``stops``: where to stop and restore (default: 0, the end,
    and points in between). ``elastic``: also resume a ``canonical_replicas=4`` run taken on 2
    ranks on 1 and on 4 ranks.
    """
    chosen = runners or available()
    unknown = [r for r in chosen if r not in REGISTRY]
    if unknown:
        raise ConfigError(f"check_operator: unknown runner(s) {unknown}; known: {list(REGISTRY)}")
    checker = _Checker(build, key, chosen, workers)
    _check_fingerprint(checker)
    _check_pickle(checker)
    expected = checker.reference()
    _check_stateless(checker)
    _check_reset_contract(checker)
    checker.runner_equality(expected)
    n = len(expected)
    points = sorted(set(stops if stops is not None else [0, 1, n // 4, n // 2, 3 * n // 4, n]))
    checker.stop_and_restore(expected, points)
    if elastic:
        try:
            # a window boundary: the same count on both lanes of each rank
            checker.elastic(max(2, n // 32 * 2))
        except ZephonError as exc:
            raise OperatorCheckError(
                "elastic resume", f"resuming on another rank count raised: {exc}", str(exc)
            ) from exc
    return checker.report
