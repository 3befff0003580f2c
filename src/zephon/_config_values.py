"""Values of a pipeline description checked against the Python API's type hints.

Each value is checked against the annotation of the parameter it is for; an error names the
key path of the offending value (``operators[2].max_length: expected int, got 'abc'``).
``zephon.config`` and the mixture section's parser both check through here.
"""

from __future__ import annotations

import collections.abc as cabc
import difflib
import importlib
import inspect
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import msgspec

from zephon._operator_defs import (
    OperatorParameter,
    parameters_of,
)
from zephon.errors import ConfigError, did_you_mean


class ConfigFileError(ConfigError):
    """A pipeline description is invalid. ``key`` is the path of the offending value
    (``operators[2].max_length``), ``file`` the YAML file when there is one."""

    def __init__(self, key: str, message: str, *, file: str | None = None) -> None:
        self.key = key
        self.file = file
        self.detail = message
        where = f"{key}: " if key else ""
        prefix = f"{file}: " if file else ""
        super().__init__(f"{prefix}{where}{message}")

    def in_file(self, file: str) -> ConfigFileError:
        return ConfigFileError(self.key, self.detail, file=file)


# --------------------------------------------------------------------------- value checking


def shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if tp is Any:
        return "any value"
    if tp is type(None) or tp is None:
        return "null"
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if origin in (list, tuple, cabc.Sequence):
        return "a list"
    if origin in (dict, cabc.Mapping):
        return "a mapping"
    if origin is cabc.Callable or tp is cabc.Callable:
        return "an import path 'module:function'"
    names = {bool: "true/false", int: "int", float: "number", str: "string"}
    if tp in names:
        return names[tp]
    return getattr(tp, "__name__", str(tp))


def import_object(spec: str, key: str) -> Any:
    """Import ``"package.module:attribute"`` (the way YAML names Python callables)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigFileError(key, f"expected an import path 'module:name', got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigFileError(key, f"cannot import module {module_name!r}: {exc}") from None
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigFileError(key, f"module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


def _literals(tp: Any) -> list[str]:
    """The string values a ``Literal`` (or a union holding one) accepts."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        return [a for a in typing.get_args(tp) if isinstance(a, str)]
    if origin in (typing.Union, types.UnionType):
        return [v for a in typing.get_args(tp) for v in _literals(a)]
    return []


def _did_you_mean(value: Any, tp: Any) -> str:
    return did_you_mean(value, _literals(tp))


_SEQUENCES: tuple[Any, ...] = (list, tuple, cabc.Sequence)
_MAPPINGS: tuple[Any, ...] = (dict, cabc.Mapping)
_UNIONS: tuple[Any, ...] = (typing.Union, types.UnionType)
_NOT_CONVERTIBLE: Any = object()  # what ``_schema`` gives for a hint msgspec cannot check


def _schema(tp: Any) -> Any:
    """``tp`` as a type ``msgspec.convert`` checks the way YAML values are meant (sequences
    as lists, ``object`` as Any), or ``_NOT_CONVERTIBLE`` when it holds an import path, a
    ``MixtureSpec`` or another class, which :func:`_check_other` handles."""
    origin = typing.get_origin(tp)
    if tp is Any or tp is object:
        return Any
    if tp is None or tp is type(None):
        return type(None)
    if tp in (bool, int, float, str):
        return tp
    if origin is Literal:
        plain = all(
            a is None or (isinstance(a, int | str) and not isinstance(a, bool))
            for a in typing.get_args(tp)
        )
        return tp if plain else _NOT_CONVERTIBLE
    if origin in _UNIONS:
        options = [_schema(a) for a in typing.get_args(tp)]
        if _NOT_CONVERTIBLE in options:
            return _NOT_CONVERTIBLE
        return typing.Union[tuple(options)]  # noqa: UP007 - built from a runtime tuple
    if origin in _SEQUENCES or origin in _MAPPINGS or tp in (*_SEQUENCES, *_MAPPINGS):
        return _container_schema(tp)
    return _NOT_CONVERTIBLE


def _container_schema(tp: Any) -> Any:
    """``list[item]`` for any sequence hint, ``dict[key, value]`` for any mapping hint."""
    args = [_schema(a) for a in typing.get_args(tp)]
    if _NOT_CONVERTIBLE in args:
        return _NOT_CONVERTIBLE
    if (typing.get_origin(tp) or tp) in _SEQUENCES:
        return list[args[0] if args else Any]  # type: ignore[misc]
    kt, vt = args if len(args) == 2 else (Any, Any)
    return dict[kt, vt]  # type: ignore[valid-type]


def _mismatch(value: Any, tp: Any, key: str) -> ConfigFileError:
    return ConfigFileError(
        key, f"expected {_type_name(tp)}, got {shown(value)}{_did_you_mean(value, tp)}"
    )


def _converts(value: Any, schema: Any) -> bool:
    try:
        msgspec.convert(value, schema, strict=True)
    except msgspec.ValidationError:
        return False
    return True


def _refused(value: Any, schema: Any, key: str) -> ConfigFileError:
    """The error for a value msgspec refused: descend through lists and mappings (not into
    unions, whose error names the union) to the innermost refused value and its key path."""
    while True:
        origin = typing.get_origin(schema)
        args = typing.get_args(schema)
        step: tuple[Any, Any, str] | None = None
        if origin is list and isinstance(value, list):
            step = next(
                (
                    (v, args[0], f"{key}[{i}]")
                    for i, v in enumerate(value)
                    if not _converts(v, args[0])
                ),
                None,
            )
        elif origin is dict and isinstance(value, dict):
            kt, vt = args
            step = next(
                (
                    (k, kt, key) if not _converts(k, kt) else (v, vt, f"{key}.{k}")
                    for k, v in value.items()
                    if not (_converts(k, kt) and _converts(v, vt))
                ),
                None,
            )
        if step is None:
            return _mismatch(value, schema, key)
        value, schema, key = step


def check_value(value: Any, tp: Any, key: str) -> Any:
    """Check ``value`` (as loaded from YAML) against the type hint ``tp``; return it converted
    (ints to float where a number is asked for, import paths to callables, mixtures to
    ``MixtureSpec``). msgspec checks what it can express; raises naming ``key``."""
    schema = _schema(tp)
    if schema is not _NOT_CONVERTIBLE:
        try:
            return msgspec.convert(value, schema, strict=True)
        except msgspec.ValidationError:
            raise _refused(value, schema, key) from None
        except TypeError:  # a union msgspec cannot tell apart (e.g. two string types)
            pass
    return _check_other(value, tp, key)


def _check_union(value: Any, tp: Any, key: str) -> Any:
    for option in typing.get_args(tp):
        try:
            return check_value(value, option, key)
        except ConfigFileError:
            continue
    raise _mismatch(value, tp, key)


def _check_callable(value: Any, tp: Any, key: str) -> Any:
    if not isinstance(value, str):
        raise _mismatch(value, tp, key)
    obj = import_object(value, key)
    if not callable(obj):
        raise ConfigFileError(key, f"{value!r} is not callable")
    return obj


def _check_other(value: Any, tp: Any, key: str) -> Any:
    """The hints msgspec cannot check: unions of them, containers of them, literals of
    booleans, import paths, ``MixtureSpec`` and other classes (an instance is passed on)."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in _UNIONS:
        return _check_union(value, tp, key)
    if origin is Literal:
        if value in args and not (isinstance(value, bool) and True not in args):
            return value
        raise _mismatch(value, tp, key)
    if origin in _SEQUENCES:
        if not isinstance(value, list):
            raise _mismatch(value, tp, key)
        return [check_value(v, args[0], f"{key}[{i}]") for i, v in enumerate(value)]
    if origin in _MAPPINGS:
        if not isinstance(value, dict):
            raise _mismatch(value, tp, key)
        kt, vt = args
        return {check_value(k, kt, key): check_value(v, vt, f"{key}.{k}") for k, v in value.items()}
    if origin is cabc.Callable or tp is cabc.Callable:
        return _check_callable(value, tp, key)
    from zephon.work import MixtureSpec

    if tp is MixtureSpec:
        if not isinstance(value, dict):
            raise _mismatch(value, tp, key)
        try:
            return MixtureSpec(value)
        except ConfigError as exc:
            raise ConfigFileError(key, str(exc)) from None
    if isinstance(tp, type) and not isinstance(value, tp):
        raise _mismatch(value, tp, key)
    return value  # an instance, or an annotation we cannot check statically: the callee decides


def check_call(
    func: Callable[..., Any],
    params: Mapping[str, Any],
    key: str,
    *,
    skip: Sequence[str] = (),
    what: str = "",
) -> dict[str, Any]:
    """Check keyword arguments for ``func``: unknown, missing and mistyped ones name ``key``."""
    takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in inspect.signature(func).parameters.values())
    accepted = parameters_of(func, tuple(skip))
    return check_parameters(accepted, params, key, what=what, takes_kwargs=takes_kwargs)


def check_parameters(
    parameters: Sequence[OperatorParameter],
    params: Mapping[str, Any],
    key: str,
    *,
    what: str = "",
    takes_kwargs: bool = False,
) -> dict[str, Any]:
    """Check keyword arguments against ``parameters``: unknown ones get "did you mean", and
    missing and mistyped ones name ``key``."""
    accepted = {p.name: p for p in parameters}
    out: dict[str, Any] = {}
    for name, value in params.items():
        where = f"{key}.{name}" if key else str(name)
        if name not in accepted:
            if takes_kwargs:
                out[name] = value
                continue
            close = difflib.get_close_matches(str(name), list(accepted), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigFileError(
                where,
                f"unknown parameter{' of ' + what if what else ''}{hint} "
                f"(known: {', '.join(accepted)})",
            )
        out[name] = check_value(value, accepted[name].annotation, where)
    for name, p in accepted.items():
        if p.required and name not in out:
            raise ConfigFileError(
                f"{key}.{name}" if key else name,
                f"required{' by ' + what if what else ''} but missing",
            )
    return out
