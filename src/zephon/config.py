"""Pipelines described in YAML: datasets, mixture, source, operators, runner and options.

The schema is derived from the Python API, so the two cannot drift apart: every operator entry
is a call of the :class:`~zephon.Pipeline` builder method of the same name, checked against that
method's signature and type hints; ``source`` holds the keyword arguments of
:class:`~zephon.StaticMixtureWorkSource` (or, with ``kind: capture_stream``, those of
:class:`~zephon.capture.streaming.StreamingCaptureSource`, ``store`` a URL); ``options`` those of
:class:`~zephon.options.RuntimeOptions`. Every error names the key path of the offending value
(``operators[2].max_length: expected int, got 'abc'``), which is what ``zephon run`` prints.
See docs/yaml.md.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import zephon.pipeline  # noqa: F401 - its builder methods define the operators
from zephon._config_values import (
    ConfigFileError,
    check_call,
    check_parameters,
    check_value,
    import_object,
    shown,
)
from zephon._mixture_config import parse_mixture
from zephon._operator_defs import (
    OperatorDefinition,
    OperatorParameter,
    operator_definition,
    operator_definitions,
    operators_markdown,
)
from zephon.errors import ConfigError, ZephonError

__all__ = [
    "OPERATORS",
    "ConfigFileError",
    "OperatorDefinition",
    "OperatorParameter",
    "PipelineConfig",
    "load_config",
    "operator_definition",
    "operator_definitions",
    "operators_markdown",
    "parse_config",
]

TOP_LEVEL_KEYS = (
    "datasets", "mixture", "source", "fetch", "operators", "runner", "options", "epoch",
    "metrics",
)  # fmt: skip
METRICS_KEYS = ("statsd", "prefix", "interval_s", "max_packet_bytes")
DATASET_KEYS = (
    "name", "path", "format", "columns", "storage_options", "cache_dir", "cache",
    "decode_images", "allow_pickle", "format_options", "samples",
)  # fmt: skip
#: ``samples:`` of a pre-tokenized dataset: the view and its parameters.
SAMPLES_KEYS = (
    "view",
    "seq_length",
    "plus_one",
    "rows_per_item",
    "seed",
    "positions",
    "pad_id",
    "order",
    "samples",
    "split",
    "part",
)

#: ``source.kind``: the work source the ``source`` section configures.
SOURCE_KINDS = ("mixture", "capture_stream")

#: Operator name in YAML -> Pipeline builder method of the same name (one registry).
OPERATORS = tuple(d.name for d in operator_definitions())
#: Operators that may follow ``batch`` (they see SampleBatch objects).
AFTER_BATCH = tuple(d.name for d in operator_definitions() if d.after_batch)


# --------------------------------------------------------------------------- the description


@dataclass(frozen=True)
class DatasetConfig:
    name: str
    paths: list[str]
    fmt: str | None = None
    columns: list[str] | None = None
    storage_options: dict[str, Any] | None = None
    cache_dir: str | None = None
    cache: dict[str, Any] | None = None
    decode_images: bool = False
    allow_pickle: bool = False
    format_options: dict[str, Any] | None = None
    samples: dict[str, Any] | None = None  # token_chunks / token_packs view and its arguments
    key: str = "datasets"


@dataclass(frozen=True)
class OperatorConfig:
    name: str
    params: dict[str, Any]
    key: str
    custom: Any = None  # the BaseOp subclass for "module:Class" operators


@dataclass
class PipelineConfig:
    """A validated pipeline description; :meth:`build` opens the datasets and returns the
    :class:`~zephon.Pipeline`."""

    datasets: list[DatasetConfig]
    mixture: Any = None  # {name: weight}, a MixtureSpec or a MixtureSchedule
    source: dict[str, Any] = field(default_factory=dict)
    fetch: dict[str, Any] = field(default_factory=dict)
    operators: list[OperatorConfig] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)  # sinks for `zephon run`
    file: str | None = None
    epoch: int | None = None  # Pipeline.set_epoch; None: not given (epoch 0)
    source_kind: str = "mixture"  # one of SOURCE_KINDS

    def _fail(self, key: str, message: str) -> ConfigFileError:
        return ConfigFileError(key, message, file=self.file)

    def open_datasets(self) -> list[Any]:
        from zephon.io import CacheOptions, Dataset

        out = []
        for d in self.datasets:
            path: Any = d.paths[0] if len(d.paths) == 1 else d.paths
            try:
                out.append(
                    Dataset.from_path(
                        d.name,
                        path,
                        fmt=d.fmt,
                        columns=d.columns,
                        storage_options=d.storage_options,
                        cache_dir=d.cache_dir,
                        cache=CacheOptions(**d.cache) if d.cache else None,
                        decode_images=d.decode_images,
                        allow_pickle=d.allow_pickle,
                        format_options=d.format_options,
                    )
                )
            except ZephonError as exc:
                raise self._fail(f"{d.key}.path", str(exc)) from None
            if d.samples is not None:
                out[-1] = self._sample_view(out[-1], d)
        return out

    def _sample_view(self, dataset: Any, d: DatasetConfig) -> Any:
        """``samples: {view: chunks | packs, seq_length, ...}``: the dataset's token files as
        training samples (``zephon.io.token_chunks`` / ``token_packs``)."""
        from zephon.io import token_chunks, token_packs

        assert d.samples is not None
        params = dict(d.samples)
        view = token_chunks if params.pop("view", "chunks") == "chunks" else token_packs
        try:
            return view(dataset, **params)
        except (ZephonError, TypeError) as exc:
            raise self._fail(f"{d.key}.samples", str(exc)) from None

    def build(self) -> Any:
        """Open the datasets, build the work source and the pipeline (errors name the key)."""
        return self._assemble(self.open_datasets(), self.mixture)

    def build_on(self, datasets: list[Any], source: dict[str, Any] | None = None) -> Any:
        """The pipeline over ``datasets`` instead of the files, with ``source`` replacing the
        file's source settings (``zephon convert`` runs the operators over parts of shards)."""
        if source is not None:
            return dataclasses.replace(self, source=source)._assemble(datasets, None)
        return self._assemble(datasets, self.mixture)

    def list_datasets(self) -> list[list[tuple[str, str, int | None]]]:
        """Each dataset's shards as ``(url, format, rows or None)``, from metadata alone."""
        from zephon.io import list_shards

        out = []
        for d in self.datasets:
            path: Any = d.paths[0] if len(d.paths) == 1 else d.paths
            try:
                out.append(list_shards(path, fmt=d.fmt, storage_options=d.storage_options))
            except ZephonError as exc:
                raise self._fail(f"{d.key}.path", str(exc)) from None
        return out

    def build_unread(self) -> Any:
        """The pipeline over one-row placeholders instead of the datasets: every operator and
        option is built and checked, nothing is read (``zephon explain``). The mixture is
        validated when parsed but not applied: its weights need the real row counts."""
        from zephon.io import Dataset

        self.list_datasets()
        return self._assemble([Dataset.from_records(d.name, [{}]) for d in self.datasets], None)

    def _source_pipeline(self, datasets: list[Any], mixture: Any) -> Any:
        from zephon.pipeline import Pipeline
        from zephon.work import StaticMixtureWorkSource

        try:
            if self.source_kind == "capture_stream":
                return _capture_stream(self.source)
            return Pipeline(StaticMixtureWorkSource(datasets, mixture, **self.source))
        except ConfigError as exc:
            raise self._fail("source", str(exc)) from None

    def _assemble(self, datasets: list[Any], mixture: Any) -> Any:
        pipe = self._source_pipeline(datasets, mixture)
        if self.epoch is not None:
            pipe.set_epoch(self.epoch)
        if self.fetch:
            pipe.fetch(**self.fetch)
        for op in self.operators:
            try:
                if op.custom is not None:
                    params = dict(op.params)
                    parallelism = params.pop("parallelism", None)
                    pipe.add_op(op.custom(**params), parallelism=parallelism)
                else:
                    getattr(pipe, op.name)(**op.params)
            except (ConfigError, TypeError, ValueError) as exc:
                param = getattr(exc, "param", None)
                text = str(exc)
                if not text.startswith(f"{op.name}:"):
                    text = f"{op.name}: {text}"
                raise self._fail(f"{op.key}.{param}" if param else op.key, text) from None
        if self.options:
            try:
                pipe.options(**self.options)
            except ConfigError as exc:
                raise self._fail("options", str(exc)) from None
        return pipe

    def summary(self) -> dict[str, Any]:
        """What the file asks for, as plain data (for ``--json`` output)."""
        return {
            "file": self.file,
            "source": self.source_kind,
            "datasets": [{"name": d.name, "path": d.paths} for d in self.datasets],
            "mixture": self.mixture
            if isinstance(self.mixture, dict | None)
            else repr(self.mixture),
            "operators": [op.name for op in self.operators],
            "options": {k: v for k, v in self.options.items() if not callable(v)},
            "epoch": self.epoch or 0,
        }


def _capture_stream(params: dict[str, Any]) -> Any:
    """A streaming capture source over the store at ``params["store"]`` (a URL or folder, so
    worker processes open their own clients), as a pipeline that hands each group on at once."""
    from zephon.capture.streaming import StreamingCaptureSource

    return StreamingCaptureSource(**params).pipeline()


def _source(data: dict[str, Any], base_dir: Path) -> tuple[str, dict[str, Any]]:
    """The ``source`` section: its kind and its checked keyword arguments. A
    ``capture_stream`` reads a capture store's prompt ledger, so it takes no datasets; its
    ``store`` is a URL or a file store's folder (relative to the YAML file's)."""
    from zephon.capture.streaming import StreamingCaptureSource
    from zephon.work import StaticMixtureWorkSource

    raw = dict(_mapping(data.get("source"), "source"))
    kind = raw.pop("kind", "mixture")
    if kind not in SOURCE_KINDS:
        raise ConfigFileError("source.kind", f"{shown(kind)} is not one of {SOURCE_KINDS}")
    if kind == "mixture":
        params = check_call(
            StaticMixtureWorkSource.__init__,
            raw,
            "source",
            skip=("datasets", "mixture"),
            what="the source",
        )
        return kind, params
    for section in ("datasets", "mixture"):
        if data.get(section) is not None:
            raise ConfigFileError(
                section, "a capture_stream source reads a capture store, not datasets: remove it"
            )
    params = check_call(StreamingCaptureSource.__init__, raw, "source", what="capture_stream")
    if not isinstance(params.get("store"), str):
        raise ConfigFileError(
            "source.store", "give the capture store's URL (file://, sqlite://...) or its folder"
        )
    params["store"] = _resolve_path(params["store"], base_dir)
    return kind, params


def _mapping(value: Any, key: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigFileError(key, f"expected a mapping, got {shown(value)}")
    return value


def _dataset(raw: Any, key: str, base_dir: Path) -> DatasetConfig:
    if not isinstance(raw, dict):
        raise ConfigFileError(key, f"expected a mapping with name and path, got {shown(raw)}")
    for k in raw:
        if k not in DATASET_KEYS:
            raise ConfigFileError(
                f"{key}.{k}", f"unknown dataset key (known: {', '.join(DATASET_KEYS)})"
            )
    for required in ("name", "path"):
        if required not in raw:
            raise ConfigFileError(f"{key}.{required}", "required but missing")
    name = check_value(raw["name"], str, f"{key}.name")
    if not name:
        raise ConfigFileError(f"{key}.name", "must be a non-empty string")
    paths = check_value(raw["path"], str | list[str], f"{key}.path")
    paths = [paths] if isinstance(paths, str) else paths
    if not paths:
        raise ConfigFileError(f"{key}.path", "needs at least one path")

    def resolve(p: str) -> str:
        if "://" in p or os.path.isabs(p):
            return p
        return str(base_dir / os.path.expanduser(p))

    fmt = check_value(
        raw.get("format"),
        _format_hint(),
        f"{key}.format",
    )
    columns = check_value(raw.get("columns"), list[str] | None, f"{key}.columns")
    storage = check_value(
        raw.get("storage_options"), dict[str, Any] | None, f"{key}.storage_options"
    )
    cache_dir = check_value(raw.get("cache_dir"), str | None, f"{key}.cache_dir")
    cache = _cache(raw.get("cache"), f"{key}.cache", resolve)
    return DatasetConfig(
        name=name,
        paths=[resolve(p) for p in paths],
        fmt=fmt,
        columns=columns,
        storage_options=storage,
        cache_dir=resolve(cache_dir) if cache_dir else None,
        cache=cache,
        decode_images=check_value(raw.get("decode_images", False), bool, f"{key}.decode_images"),
        allow_pickle=check_value(raw.get("allow_pickle", False), bool, f"{key}.allow_pickle"),
        format_options=check_value(
            raw.get("format_options"), dict[str, Any] | None, f"{key}.format_options"
        ),
        samples=_samples(raw.get("samples"), f"{key}.samples"),
        key=key,
    )


def _samples(raw: Any, key: str) -> dict[str, Any] | None:
    """``samples:`` checked: known keys, ``view`` chunks or packs, ``seq_length`` given."""
    if raw is None:
        return None
    found = check_value(raw, dict[str, Any], key)
    for k in found:
        if k not in SAMPLES_KEYS:
            raise ConfigFileError(f"{key}.{k}", f"unknown key (known: {', '.join(SAMPLES_KEYS)})")
    check_value(found.get("view", "chunks"), Literal["chunks", "packs"], f"{key}.view")
    if "seq_length" not in found:
        raise ConfigFileError(f"{key}.seq_length", "required but missing")
    check_value(found["seq_length"], int, f"{key}.seq_length")
    if found.get("view") == "packs":
        for k in ("plus_one", "positions"):
            if k in found:
                raise ConfigFileError(f"{key}.{k}", "a chunks option; packs rows have neither")
    elif "pad_id" in found:
        raise ConfigFileError(f"{key}.pad_id", "a packs option; chunks rows are never padded")
    return dict(found)


def _format_hint() -> Any:
    """``Literal[<every registered format name>] | None``: the ``format`` key's type."""
    from zephon.io import format_names

    literal: Any = Literal.__getitem__(format_names())  # type: ignore[attr-defined]
    return literal | None


def _cache(raw: Any, key: str, resolve: Any) -> dict[str, Any] | None:
    """``cache: {dir: PATH, max_bytes: N}`` -> keyword arguments of ``CacheOptions``."""
    if raw is None:
        return None
    value = check_value(raw, dict[str, Any], key)
    unknown = sorted(set(value) - {"dir", "max_bytes"})
    if unknown:
        raise ConfigFileError(f"{key}.{unknown[0]}", "unknown cache key (known: dir, max_bytes)")
    if "dir" not in value:
        raise ConfigFileError(f"{key}.dir", "required but missing")
    cache_dir = check_value(value["dir"], str, f"{key}.dir")
    max_bytes = check_value(value.get("max_bytes"), int | None, f"{key}.max_bytes")
    if max_bytes is not None and max_bytes < 1:
        raise ConfigFileError(f"{key}.max_bytes", f"must be >= 1, got {max_bytes}")
    return {"dir": resolve(cache_dir), "max_bytes": max_bytes}


def _resolve_path(value: Any, base_dir: Path) -> Any:
    """A relative tokenizer or template path -> the path under ``base_dir`` (like datasets);
    ``bytes``, template text, URLs and non-strings are returned unchanged."""
    if not isinstance(value, str) or value == "bytes" or "{" in value or "://" in value:
        return value
    expanded = os.path.expanduser(value)
    return expanded if os.path.isabs(expanded) else str(base_dir / value)


def _resolve_paths(
    definition: OperatorDefinition, params: dict[str, Any], base_dir: Path
) -> dict[str, Any]:
    """Parameters that name a file, resolved relative to the YAML file's folder."""
    out = dict(params)
    for param in definition.path_parameters:
        if param in out:
            out[param] = _resolve_path(out[param], base_dir)
    return out


def _calibration_paths(raw: Any, base_dir: Path) -> Any:
    """The mixture with ``calibration.tokenizer`` resolved like operator tokenizers."""
    calibration = raw.get("calibration") if isinstance(raw, dict) else None
    if not isinstance(calibration, dict) or "tokenizer" not in calibration:
        return raw
    tokenizer = _resolve_path(calibration["tokenizer"], base_dir)
    return {**raw, "calibration": {**calibration, "tokenizer": tokenizer}}


def _operator(raw: Any, key: str, base_dir: Path) -> OperatorConfig:
    from zephon.ops import BaseOp

    if isinstance(raw, str):
        name, params = raw, {}
    elif isinstance(raw, dict) and "op" in raw:
        name = raw["op"]
        params = {k: v for k, v in raw.items() if k != "op"}
        if not isinstance(name, str):
            raise ConfigFileError(f"{key}.op", f"expected an operator name, got {shown(name)}")
    elif isinstance(raw, dict) and len(raw) == 1:
        ((name, params),) = raw.items()
        params = _mapping(params, key) if params is not None else {}
        name = str(name)
    else:
        raise ConfigFileError(
            key,
            "expected an operator: a name, {op: NAME, param: value, ...} or "
            f"{{NAME: {{param: value, ...}}}}, got {shown(raw)}",
        )
    if ":" in name:
        cls = import_object(name, f"{key}.op")
        if not (isinstance(cls, type) and issubclass(cls, BaseOp)):
            raise ConfigFileError(f"{key}.op", f"{name!r} is not a zephon.ops.BaseOp subclass")
        extra = {"parallelism": params.pop("parallelism")} if "parallelism" in params else {}
        checked = check_call(cls.__init__, params, key, what=name)
        if extra:
            checked["parallelism"] = check_value(
                extra["parallelism"], int | Literal["auto"] | None, f"{key}.parallelism"
            )
        return OperatorConfig(name, checked, key, custom=cls)
    if name not in OPERATORS:
        close = difflib.get_close_matches(name, OPERATORS, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ConfigFileError(
            f"{key}.op" if isinstance(raw, dict) and "op" in raw else key,
            f"unknown operator {name!r}; {hint}known operators: {', '.join(OPERATORS)} "
            "(or 'package.module:Class' for your own BaseOp subclass)",
        )
    definition = operator_definition(name)
    checked = check_parameters(definition.parameters, params, key, what=name)
    return OperatorConfig(name, _resolve_paths(definition, checked, base_dir), key)


def _check_batch_order(operators: Sequence[OperatorConfig]) -> None:
    """``batch`` at most once, and only operators on batches after it."""
    batches = [i for i, op in enumerate(operators) if op.name == "batch"]
    if len(batches) > 1:
        raise ConfigFileError(operators[batches[1]].key, "batch can appear only once")
    for op in operators[batches[0] + 1 :] if batches else ():
        if op.name not in AFTER_BATCH:
            raise ConfigFileError(
                op.key,
                f"{op.name} cannot follow batch; move it before batch (only "
                f"{', '.join(AFTER_BATCH)} may follow it)",
            )


def parse_config(
    data: Any, *, base_dir: str | os.PathLike[str] = ".", file: str | None = None
) -> PipelineConfig:
    """Validate a pipeline description (the YAML document as Python data)."""
    try:
        return _parse(data, Path(base_dir))
    except ConfigFileError as exc:
        raise exc.in_file(file) if file else exc from None


def _check_sections(data: Any) -> None:
    if not isinstance(data, dict):
        raise ConfigFileError("", f"the file must be a mapping of sections, got {shown(data)}")
    for k in data:
        if k not in TOP_LEVEL_KEYS:
            close = difflib.get_close_matches(str(k), TOP_LEVEL_KEYS, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ConfigFileError(str(k), f"unknown section; {hint}known: {TOP_LEVEL_KEYS}")


def _datasets(raw_datasets: Any, base_dir: Path) -> list[DatasetConfig]:
    if raw_datasets is None:
        raise ConfigFileError("datasets", "required: a list of {name, path} entries")
    if not isinstance(raw_datasets, list) or not raw_datasets:
        raise ConfigFileError("datasets", f"expected a non-empty list, got {shown(raw_datasets)}")
    datasets = [_dataset(d, f"datasets[{i}]", base_dir) for i, d in enumerate(raw_datasets)]
    names = [d.name for d in datasets]
    for i, d in enumerate(datasets):
        if names.index(d.name) != i:
            raise ConfigFileError(f"datasets[{i}].name", f"{d.name!r} is used twice")
    return datasets


def _options(data: dict[str, Any]) -> dict[str, Any]:
    """The ``options`` section (and the ``runner`` shorthand) as RuntimeOptions keywords."""
    from zephon.options import RuntimeOptions

    options_raw = dict(_mapping(data.get("options"), "options"))
    if data.get("runner") is not None:
        if "runner" in options_raw:
            raise ConfigFileError("runner", "given both as 'runner' and as 'options.runner'")
        options_raw["runner"] = data["runner"]
    option_hints = typing.get_type_hints(RuntimeOptions)
    known = [f.name for f in dataclasses.fields(RuntimeOptions) if not f.name.startswith("_")]
    options: dict[str, Any] = {}
    for k, v in options_raw.items():
        key = "runner" if k == "runner" and "runner" in data else f"options.{k}"
        if k not in known:
            close = difflib.get_close_matches(str(k), known, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ConfigFileError(key, f"unknown option; {hint}known: {', '.join(known)}")
        options[k] = check_value(v, option_hints[k], key)
        try:
            RuntimeOptions().updated(**{k: options[k]})
        except ConfigError as exc:
            raise ConfigFileError(key, str(exc)) from None
    try:
        RuntimeOptions().updated(**options)
    except ConfigError as exc:
        raise ConfigFileError("options", str(exc)) from None
    return options


def _parse(data: Any, base_dir: Path) -> PipelineConfig:
    from zephon.pipeline import Pipeline

    _check_sections(data)
    kind, source = _source(data, base_dir)
    datasets = [] if kind == "capture_stream" else _datasets(data.get("datasets"), base_dir)
    names = [d.name for d in datasets]
    mixture = parse_mixture(_calibration_paths(data.get("mixture"), base_dir), names)
    fetch = check_call(Pipeline.fetch, _mapping(data.get("fetch"), "fetch"), "fetch")
    raw_ops = data.get("operators") or []
    if not isinstance(raw_ops, list):
        raise ConfigFileError("operators", f"expected a list, got {shown(raw_ops)}")
    operators = [_operator(op, f"operators[{i}]", base_dir) for i, op in enumerate(raw_ops)]
    _check_batch_order(operators)
    return PipelineConfig(
        datasets=datasets,
        mixture=mixture,
        source=source,
        fetch=fetch,
        operators=operators,
        options=_options(data),
        epoch=_epoch(data.get("epoch")),
        metrics=_metrics(data.get("metrics")),
        source_kind=kind,
    )


def _epoch(value: Any) -> int | None:
    """The ``epoch`` key: which pass over the data the pipeline delivers (``set_epoch``)."""
    if value is None:
        return None
    epoch = check_value(value, int, "epoch")
    if epoch < 0:
        raise ConfigFileError("epoch", f"must be an integer >= 0, got {shown(value)}")
    return int(epoch)


def _metrics(raw: Any) -> dict[str, Any]:
    """``metrics: {statsd: HOST:PORT, prefix, interval_s, max_packet_bytes}``, checked."""
    from zephon.metrics import parse_address

    value = _mapping(raw, "metrics")
    for k in value:
        if k not in METRICS_KEYS:
            raise ConfigFileError(f"metrics.{k}", f"unknown key (known: {', '.join(METRICS_KEYS)})")
    out = {
        "statsd": check_value(value.get("statsd"), str | None, "metrics.statsd"),
        "prefix": check_value(value.get("prefix", "zephon"), str, "metrics.prefix"),
        "interval_s": check_value(value.get("interval_s", 10.0), float, "metrics.interval_s"),
        "max_packet_bytes": check_value(
            value.get("max_packet_bytes", 512), int, "metrics.max_packet_bytes"
        ),
    }
    try:
        if out["statsd"] is not None:
            parse_address(out["statsd"])
        if out["interval_s"] <= 0 or out["max_packet_bytes"] < 64:
            raise ConfigError("interval_s must be > 0 and max_packet_bytes >= 64")
    except ConfigError as exc:
        raise ConfigFileError("metrics", str(exc)) from None
    return out


def load_config(path: str | os.PathLike[str]) -> PipelineConfig:
    """Read and validate a YAML pipeline file. Relative dataset paths are relative to the
    file's folder. Raises :class:`ConfigFileError` naming the file and key of any problem."""
    import yaml

    file = os.fspath(path)
    try:
        text = Path(file).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigFileError("", "config file not found", file=file) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigFileError("", f"cannot read the config file: {exc}", file=file) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ConfigFileError(where, f"invalid YAML: {problem}", file=file) from None
    if data is None:
        raise ConfigFileError("", "the file is empty; it needs at least 'datasets'", file=file)
    config = parse_config(data, base_dir=Path(file).resolve().parent, file=file)
    config.file = file
    return config
