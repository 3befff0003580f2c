"""One definition per built-in operator, derived from its ``Pipeline`` builder method.

Why derived: the builder method's signature (plus, for a method that forwards ``**kwargs``,
the operator class's constructor) is the only place an operator's parameters are spelled.
The builder's keyword check, the YAML schema (:mod:`zephon.config`) and the operator table in
docs/yaml.md all read :func:`operator_definitions`, so they cannot drift apart.
"""

from __future__ import annotations

import importlib
import inspect
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import wraps
from typing import Any, TypeVar

from zephon.errors import ConfigError, did_you_mean

__all__ = [
    "OperatorDefinition",
    "OperatorParameter",
    "operator_definition",
    "operator_definitions",
    "operators_markdown",
    "parameters_of",
    "register_builder",
    "type_hints",
]

_Method = TypeVar("_Method", bound=Callable[..., Any])


class _Required:
    """The default of a parameter that has none (shown as "required")."""

    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()


@dataclass(frozen=True, slots=True)
class OperatorParameter:
    """One keyword an operator accepts: its name, type hint and default."""

    name: str
    annotation: Any = Any
    default: Any = REQUIRED

    @property
    def required(self) -> bool:
        return self.default is REQUIRED


@dataclass(frozen=True, slots=True)
class OperatorDefinition:
    """A built-in operator: its YAML name (the builder method's), parameters and YAML roles.

    ``path_parameters`` name a file, resolved relative to a YAML file's folder;
    ``after_batch`` operators see ``SampleBatch`` objects and may follow ``batch``.
    """

    name: str
    method: Callable[..., Any]
    parameters: tuple[OperatorParameter, ...]
    summary: str = ""
    path_parameters: tuple[str, ...] = ()
    after_batch: bool = False

    def names(self) -> list[str]:
        return [p.name for p in self.parameters]

    def check_keywords(self, keywords: Mapping[str, Any]) -> None:
        """Raise :class:`ConfigError` (with "did you mean") for a keyword not accepted."""
        known = self.names()
        for key in keywords:
            if key not in known:
                raise ConfigError(
                    f"{self.name}: unknown parameter {key!r}{did_you_mean(key, known)} "
                    f"(known: {', '.join(known)})"
                )


@dataclass(frozen=True, slots=True)
class _Entry:
    method: Callable[..., Any]
    forwards: Callable[..., Any] | None
    path_parameters: tuple[str, ...]
    after_batch: bool


_BUILDERS: dict[str, _Entry] = {}
_DEFINITIONS: dict[str, OperatorDefinition] = {}


def register_builder(
    *,
    forwards: Callable[..., Any] | None = None,
    path_parameters: tuple[str, ...] = (),
    after_batch: bool = False,
) -> Callable[[_Method], _Method]:
    """Mark a ``Pipeline`` method as the builder of the operator of the same name.

    ``forwards``: the callable the method's ``**kwargs`` go to (its keywords join the
    definition, and the builder checks them before the call).
    """

    def mark(method: _Method) -> _Method:
        builder: Callable[..., Any] = method
        if forwards is not None:

            @wraps(method)
            def builder(*args: Any, **kwargs: Any) -> Any:
                operator_definition(method.__name__).check_keywords(kwargs)
                return method(*args, **kwargs)

        _BUILDERS[method.__name__] = _Entry(method, forwards, path_parameters, after_batch)
        _DEFINITIONS.clear()
        return typing.cast(_Method, builder)

    return mark


def type_hints(func: Callable[..., Any]) -> dict[str, Any]:
    """Resolved type hints of ``func``; annotations that cannot be resolved count as Any."""
    try:
        return typing.get_type_hints(func)
    except Exception:  # e.g. names imported only under TYPE_CHECKING
        pass
    module = importlib.import_module(func.__module__)
    out: dict[str, Any] = {}
    for name, ann in getattr(func, "__annotations__", {}).items():
        try:
            out[name] = eval(ann, vars(module)) if isinstance(ann, str) else ann
        except Exception:
            out[name] = Any
    return out


def parameters_of(func: Callable[..., Any], skip: tuple[str, ...] = ()) -> list[OperatorParameter]:
    """The named parameters of ``func`` (not ``self``, ``*args``, ``**kwargs`` or ``skip``)."""
    # a class's hints are its attributes'; its parameters' are its constructor's
    target: Any = func
    hints = type_hints(target.__init__ if isinstance(func, type) else func)
    out = []
    for name, p in inspect.signature(func).parameters.items():
        if name in ("self", "cls", *skip) or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        default = REQUIRED if p.default is p.empty else p.default
        out.append(OperatorParameter(name, hints.get(name, Any), default))
    return out


def _definition(name: str, entry: _Entry) -> OperatorDefinition:
    params = parameters_of(entry.method)
    if entry.forwards is not None:
        taken = {p.name for p in params}
        params += [p for p in parameters_of(entry.forwards) if p.name not in taken]
    doc = inspect.getdoc(entry.method) or ""
    return OperatorDefinition(
        name,
        entry.method,
        tuple(params),
        summary=doc.split("\n\n")[0].replace("\n", " "),
        path_parameters=entry.path_parameters,
        after_batch=entry.after_batch,
    )


def operator_definitions() -> tuple[OperatorDefinition, ...]:
    """Every built-in operator's definition, in the builder's order (the builder methods
    register themselves when :mod:`zephon.pipeline` is imported)."""
    if len(_DEFINITIONS) != len(_BUILDERS):
        _DEFINITIONS.update({n: _definition(n, e) for n, e in _BUILDERS.items()})
    return tuple(_DEFINITIONS.values())


def operator_definition(name: str) -> OperatorDefinition:
    """The definition of the built-in operator ``name``."""
    for definition in operator_definitions():
        if definition.name == name:
            return definition
    known = [d.name for d in operator_definitions()]
    raise ConfigError(f"unknown operator {name!r}{did_you_mean(name, known)}")


def _shown(param: OperatorParameter) -> str:
    if param.required:
        return f"`{param.name}`"
    default = param.default
    text = repr(tuple(default) if isinstance(default, list) else default)
    return f"`{param.name}={text}`"


def operators_markdown() -> str:
    """The operator table of docs/yaml.md: every operator and its parameters (required ones
    without a default)."""
    lines = ["| operator | parameters |", "|---|---|"]
    for d in operator_definitions():
        shown = ", ".join(_shown(p) for p in d.parameters) or "(none)"
        lines.append(f"| `{d.name}` | {shown} |")
    return "\n".join(lines) + "\n"
