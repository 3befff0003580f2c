"""Every exception token capture defines is a ``ZephonError`` and keeps its builtin base, so
``except ValueError`` (or ``LookupError``...) written against the old classes still catches."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import zephon.capture
from zephon.errors import DataFormatError, ZephonError

# Each exception class of zephon.capture (public or private) and the base it had before it
# joined the ZephonError tree; a new class must be added here.
BASES: dict[str, type[BaseException]] = {
    "zephon.capture.protocols.CaptureAdmissionRefused": ValueError,
    "zephon.capture.protocols.CaptureConflictError": ValueError,
    "zephon.capture.records.CaptureRecordError": ValueError,
    "zephon.capture.protocols.CaptureHistoryUnrepresentable": ValueError,
    "zephon.capture.protocols.CaptureOrderError": ValueError,
    "zephon.capture.protocols.TokenCaptureFrozenError": RuntimeError,
    "zephon.capture.protocols.TokenCaptureRetiredError": RuntimeError,
    "zephon.capture.protocols.RolloutRetiredError": LookupError,
    "zephon.capture.ledger.LedgerTransitionError": ValueError,
    "zephon.capture._conformance_kit.ConformanceError": AssertionError,
    "zephon.capture.testing._chaos.ChaosError": AssertionError,
    "zephon.capture._conformance_kit._Skip": Exception,
    "zephon.capture.stores._fsutil.LogCorruptionError": DataFormatError,
    "zephon.capture.proxy._limits.ClientRefused": Exception,
    "zephon.capture.proxy._requests.BadRequest": Exception,
    "zephon.capture.proxy._inference.InferenceUnavailable": Exception,
    "zephon.capture.proxy.app._BodyError": ValueError,
    "zephon.capture.proxy._tokens.TokenDataError": ValueError,
    "zephon.capture.proxy._protocol._HeadersTooLarge": Exception,
}


def capture_exceptions() -> dict[str, type[BaseException]]:
    """Exception classes (warnings aside) defined in any module of zephon.capture."""
    found: dict[str, type[BaseException]] = {}
    prefix = zephon.capture.__name__ + "."
    modules = [zephon.capture.__name__] + [
        info.name for info in pkgutil.walk_packages(zephon.capture.__path__, prefix)
    ]
    for name in modules:
        module = importlib.import_module(name)
        for obj in vars(module).values():
            if (
                inspect.isclass(obj)
                and issubclass(obj, BaseException)
                and not issubclass(obj, Warning)
                and obj.__module__ == name
            ):
                found[f"{name}.{obj.__qualname__}"] = obj
    return found


def test_every_capture_exception_is_a_zephon_error_with_its_old_base() -> None:
    found = capture_exceptions()
    assert sorted(found) == sorted(BASES)
    for name, cls in found.items():
        assert issubclass(cls, ZephonError), name
        assert issubclass(cls, BASES[name]), name


def test_the_public_errors_are_caught_both_ways() -> None:
    from zephon.capture import CaptureAdmissionRefused, RolloutRetiredError

    for cls, base in ((CaptureAdmissionRefused, ValueError), (RolloutRetiredError, LookupError)):
        for catch in (base, ZephonError):
            try:
                raise cls("refused")
            except catch as exc:
                assert str(exc) == "refused"
