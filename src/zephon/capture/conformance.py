"""Black-box conformance suite for any token capture transport (importable without pytest).

``await run_conformance(sink_factory, source_factory, lineage_factory, ledger_factory)`` runs every
contract check a black box can exercise: the reference suite (put/freeze visibility, idempotent and
conflicting re-puts, mark_incomplete, freeze idempotency, the post-freeze fence, conditional
retirement, lineage visibility, begin_call custody) plus the main-branch contract (typed errors,
retire/delete life cycle, engine refusals, the ledger and its admission cut) and concurrency
between two clients.

Each factory is a zero-argument callable (sync or async) returning a FRESH client over the SAME
backend; every step uses new clients so cross-client visibility is what is tested. Every client is
closed once at the end. Rollout ids are ``f"{rollout_prefix}-{check}..."``; the default prefix is
unique per run, so a run can repeat on a backend that keeps its data.
"""

from __future__ import annotations

import asyncio
import time
import uuid
import warnings
from collections.abc import Iterable
from typing import Any

from zephon.capture._conformance_checks import CHECKS, NEEDS
from zephon.capture._conformance_kit import (
    CheckResult,
    Factory,
    _Ctx,
    _Skip,
)
from zephon.capture._conformance_kit import (
    ConformanceError as ConformanceError,
)
from zephon.capture._conformance_kit import (
    ConformanceReport as ConformanceReport,
)
from zephon.capture._conformance_kit import (
    ConformanceWarning as ConformanceWarning,
)

__all__ = ["CHECKS", "CheckResult"]

# --------------------------------------------------------------------------- runner


async def run_conformance(
    sink_factory: Factory,
    source_factory: Factory,
    lineage_factory: Factory | None = None,
    ledger_factory: Factory | None = None,
    *,
    rollout_prefix: str | None = None,
    checks: Iterable[str] | None = None,
    raise_on_failure: bool = True,
    timeout_s: float = 60.0,
) -> ConformanceReport:
    """Run the checks (all, or those named in ``checks``) and return a report.

    With ``raise_on_failure`` (the default) the first failing check raises
    :class:`ConformanceError`; otherwise failures are recorded and the run continues. Checks
    whose optional extension or factory is missing emit :class:`ConformanceWarning`.
    """
    names = list(CHECKS) if checks is None else list(checks)
    unknown = [n for n in names if n not in CHECKS]
    if unknown:
        raise ValueError(f"unknown conformance checks {unknown}; known: {', '.join(CHECKS)}")
    prefix = rollout_prefix or f"conf-{uuid.uuid4().hex[:10]}"
    factories = {
        "sink": sink_factory,
        "source": source_factory,
        "lineage": lineage_factory,
        "ledger": ledger_factory,
    }
    report = ConformanceReport()
    for name in names:
        ctx = _Ctx(factories, prefix)
        ctx.check = name
        started = time.perf_counter()
        try:
            missing = [k for k in NEEDS.get(name, ()) if factories[k] is None]
            if missing:
                raise _Skip(f"no {missing[0]}_factory given")
            await asyncio.wait_for(CHECKS[name](ctx), timeout_s)
            result = CheckResult(name, "passed")
        except _Skip as skip:
            warnings.warn(ConformanceWarning(f"{name} skipped: {skip}"), stacklevel=2)
            result = CheckResult(name, "warned", str(skip))
        except ConformanceError as exc:
            result = CheckResult(name, "failed", exc.detail)
        except TimeoutError:
            result = CheckResult(name, "failed", f"timed out after {timeout_s} s")
        except Exception as exc:
            result = CheckResult(name, "failed", f"unexpected {type(exc).__name__}: {exc}")
        finally:
            await ctx.close_all()
        result.seconds = time.perf_counter() - started
        report.results.append(result)
        if result.status == "failed" and raise_on_failure:
            raise ConformanceError(name, result.detail)
    return report


def run_conformance_sync(*args: Any, **kwargs: Any) -> ConformanceReport:
    """:func:`run_conformance` for synchronous callers (starts its own event loop)."""
    return asyncio.run(run_conformance(*args, **kwargs))
