"""The fluent Pipeline builder: a thin list of operator specs handed to the engine."""

from __future__ import annotations

import copy
import functools
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any, Literal, TypeVar

from zephon._engine.feed.fetch import FetchOp
from zephon._engine.plan.auto import Parallelism, checked_width
from zephon._engine.plan.compile import check_restore, config_fingerprint, view_lanes
from zephon._engine.plan.compile import compile as compile_run
from zephon._engine.plan.plan import OpSpec, Plan, Resources, ray_resources
from zephon._engine.run.engine import Engine
from zephon._engine.run.engine_process import EngineProcess
from zephon._engine.run.lane_workers import LaneWorkers
from zephon._engine.stats import RunStats
from zephon._operator_defs import register_builder
from zephon._ops._chat_spans import LossScope, SpanSource
from zephon._ops._pack_groups import Homogeneity, ShuffleStrategy
from zephon._ops._packing_algos import FlushStrategy, PackingAlgorithm
from zephon._ops._token_measure import row_counter
from zephon._ops.batch import BatchOp
from zephon._ops.decode_image import DecodeImageOp
from zephon._ops.decode_text import DecodeTextOp
from zephon._ops.decode_video import DecodeVideoOp
from zephon._ops.ensure_mixture import EnsureMixtureOp
from zephon._ops.expand_chat import ExpandChatOp
from zephon._ops.image_tokens import ImageTokensOp
from zephon._ops.map_batch import MapBatchOp, MaterializeOp
from zephon._ops.map_transform import FilterOp, MapTransformOp
from zephon._ops.pack import PackFlatOp, PackSequencesOp
from zephon._ops.shuffle import ShuffleAlgorithm, ShuffleOp
from zephon._ops.stateful_transform import StatefulTransformOp
from zephon._ops.tokenize import SpecialTokens, TokenizeOp
from zephon._ops.tokenize_chat import TokenizeChatOp
from zephon.checkpoints import format as ckpt
from zephon.checkpoints.passes import split_later, start_of_pass, with_lanes
from zephon.errors import CheckpointError, ConfigError
from zephon.ops import BaseOp
from zephon.options import ENGINE_PROCESS_RUNNERS, RuntimeOptions
from zephon.types import SampleBatch, StreamItem
from zephon.work import MixtureSpec, TokenMeasuredSource, WorkSource, source_mixture

__all__ = ["OPERATOR_METHODS", "Placement"]

Placement = Literal["local", "remote"]
_Method = TypeVar("_Method", bound=Callable[..., Any])
log = logging.getLogger("zephon")

#: The builder methods that append a built-in operator, in definition order. Their names are
#: the operators' YAML names, and their signatures the operators' definitions
#: (:func:`zephon.config.operator_definitions`).
OPERATOR_METHODS: list[str] = []


def _operator(
    *,
    forwards: Callable[..., Any] | None = None,
    path_parameters: tuple[str, ...] = (),
    after_batch: bool = False,
) -> Callable[[_Method], _Method]:
    """Register a builder method as the definition of the operator of the same name."""
    mark = register_builder(
        forwards=forwards, path_parameters=path_parameters, after_batch=after_batch
    )

    def register(method: _Method) -> _Method:
        OPERATOR_METHODS.append(method.__name__)
        return mark(method)

    return register


class Pipeline:
    """A chain of operators over a work source. Iterate it to get records (or batches).

    Every builder method appends one operator and returns the pipeline, so calls chain::

        pipe = (Pipeline(source).decode_text().tokenize("bytes").batch(8)
                .options(runner="threads"))
        for batch in pipe: ...
    """

    def __init__(self, work_source: WorkSource) -> None:
        if not isinstance(work_source, WorkSource):
            raise ConfigError(
                f"Pipeline needs a WorkSource (e.g. StaticMixtureWorkSource), got "
                f"{type(work_source).__name__}"
            )
        self.work_source = work_source
        self._specs: list[OpSpec] = []
        self._fetch_parallelism: Parallelism | None = None
        self._fetch_placement: Placement = "local"
        self._fetch_resources: tuple[tuple[str, float], ...] = ()
        self._fetch_max_batch = 64
        self._fetch_on_error: Literal["raise", "skip"] | None = None
        self._options = RuntimeOptions()
        self.last_stats: RunStats | None = None
        self._batched = False
        self._engine: Engine | EngineProcess | LaneWorkers | None = None
        self._engine_done = True
        self._resume: ckpt.ParsedCheckpoint | None = None
        # this view's lanes restored in a later pass than the current one, until their pass
        self._later: dict[int, ckpt.LaneCheckpoint] = {}
        self._pass_lengths: dict[tuple[int, tuple[int, ...]], int] = {}
        self._epoch = 0
        self._epoch_chosen = True  # False once an iteration started without a new set_epoch
        self._origin: Any = None
        self._interrupt: Callable[[], bool] | None = None

    # -- builder -------------------------------------------------------------------------

    def _append(
        self,
        op: BaseOp,
        parallelism: Parallelism | None,
        placement: Placement = "local",
        resources: Resources | None = None,
    ) -> Pipeline:
        if self._batched and not isinstance(op, (BatchOp, MapBatchOp)):
            raise ConfigError(
                f"{op.name} cannot follow batch(): operators after batch would see SampleBatch "
                "objects; move it before batch(), or use map_batch()"
            )
        if isinstance(op, MapBatchOp) and not self._batched:
            raise ConfigError(f"{op.name}: map_batch() needs a batch() before it")
        if placement not in ("local", "remote"):
            raise ConfigError(
                f"{op.name}: placement must be 'local' or 'remote' (Ray actors), got {placement!r}"
            )
        width = checked_width(op.name, parallelism, op.traits().parallelism)
        self._specs.append(
            OpSpec(
                op,
                max(1, width or 1),
                placement,
                ray_resources(op.name, resources, placement),
                auto=width is None,
            )
        )
        return self

    def _measure_token_mixture(self, output_field: str) -> None:
        """A token mixture without estimates is measured when the first tokenize (or
        tokenize_chat) is appended, through the operators appended so far."""
        source = self.work_source
        if isinstance(source, TokenMeasuredSource) and source.needs_measuring():
            ops = [spec.op for spec in self._specs]
            source.measure_tokens(row_counter(ops, output_field))

    def fetch(
        self,
        parallelism: Parallelism | None = None,
        *,
        max_batch: int = 64,
        on_error: Literal["raise", "skip"] | None = None,
        placement: Placement = "local",
        resources: Resources | None = None,
    ) -> Pipeline:
        """Configure the implicit first operator that reads rows for the pointers."""
        if placement not in ("local", "remote"):
            raise ConfigError(f"fetch: placement must be 'local' or 'remote', got {placement!r}")
        checked_width("fetch", parallelism, 1)
        self._fetch_placement = placement
        self._fetch_resources = ray_resources("fetch", resources, placement)
        self._fetch_parallelism = parallelism
        self._fetch_max_batch = max_batch
        self._fetch_on_error = on_error
        return self

    @_operator(forwards=DecodeTextOp)
    def decode_text(
        self,
        parallelism: Parallelism | None = None,
        *,
        placement: Placement = "local",
        resources: Resources | None = None,
        **kwargs: Any,
    ) -> Pipeline:
        """Make text fields ``str``; kwargs: fields, encoding, errors, normalize_newlines..."""
        return self._append(DecodeTextOp(**kwargs), parallelism, placement, resources)

    @_operator(forwards=DecodeImageOp)
    def decode_image(
        self,
        parallelism: Parallelism | None = None,
        *,
        placement: Placement = "local",
        resources: Resources | None = None,
        **kwargs: Any,
    ) -> Pipeline:
        """Decode image bytes to uint8 RGB arrays, resized to patch multiples, with patch
        grids and vision-token counts; kwargs: fields, resize, min_pixels, max_pixels..."""
        return self._append(DecodeImageOp(**kwargs), parallelism, placement, resources)

    @_operator(forwards=DecodeVideoOp)
    def decode_video(
        self,
        parallelism: Parallelism | None = None,
        *,
        placement: Placement = "local",
        resources: Resources | None = None,
        **kwargs: Any,
    ) -> Pipeline:
        """Decode video bytes (PyAV) to uint8 RGB frames sampled at ``fps``, resized to patch
        multiples, with patch grids and vision-token counts; kwargs: fields, fps, min_frames,
        max_frames, temporal_patch_size and decode_image's."""
        return self._append(DecodeVideoOp(**kwargs), parallelism, placement, resources)

    @_operator(forwards=ImageTokensOp)
    def image_tokens(
        self,
        parallelism: Parallelism | None = None,
        *,
        placement: Placement = "local",
        resources: Resources | None = None,
        **kwargs: Any,
    ) -> Pipeline:
        """Patch grids and vision-token counts of encoded images from their headers, without
        decoding (what ``decode_image`` would count); kwargs as ``decode_image``'s."""
        return self._append(ImageTokensOp(**kwargs), parallelism, placement, resources)

    @_operator()
    def map_transform(
        self,
        fn: Callable[[Any], Any],
        *,
        drop_none: bool = True,
        parallelism: Parallelism | None = None,
        name: str | None = None,
        placement: Placement = "local",
        resources: Resources | None = None,
    ) -> Pipeline:
        """Apply ``fn`` to each payload; returning ``None`` drops the record."""
        op = MapTransformOp(fn, drop_none=drop_none, name=name)
        return self._append(op, parallelism, placement, resources)

    @_operator()
    def filter(
        self,
        predicate: Callable[[Any], bool],
        *,
        parallelism: Parallelism | None = None,
        name: str | None = None,
        placement: Placement = "local",
        resources: Resources | None = None,
    ) -> Pipeline:
        """Keep records whose payload satisfies ``predicate``."""
        return self._append(FilterOp(predicate, name=name), parallelism, placement, resources)

    @_operator(path_parameters=("tokenizer",))
    def tokenize(
        self,
        tokenizer: Any = "bytes",
        *,
        field: str = "text",
        output_field: str = "input_ids",
        special_tokens: SpecialTokens = "bos_eos",
        bos_token_id: int | None = None,
        eos_token_id: int | None = None,
        max_length: int | None = None,
        truncation: bool | None = None,
        split_long_samples: bool = False,
        parallelism: Parallelism | None = None,
        placement: Placement = "local",
        resources: Resources | None = None,
    ) -> Pipeline:
        """Tokenize ``field`` into ``output_field`` (numpy int32 ids). With ``max_length``,
        longer documents are truncated, or with ``split_long_samples=True`` cut into
        consecutive child records of at most ``max_length`` tokens (docs/operators.md)."""
        op = TokenizeOp(
            tokenizer,
            field=field,
            output_field=output_field,
            special_tokens=special_tokens,
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            max_length=max_length,
            truncation=truncation,
            split_long_samples=split_long_samples,
        )
        self._append(op, parallelism, placement, resources)
        self._measure_token_mixture(output_field)
        return self

    @_operator()
    def expand_chat(
        self,
        *,
        field: str = "messages",
        parallelism: Parallelism | None = None,
        placement: Placement = "local",
        resources: Resources | None = None,
    ) -> Pipeline:
        """One record per assistant turn: the conversation in ``field`` up to that turn
        (child lineage; conversations without an assistant turn become tombstones)."""
        return self._append(ExpandChatOp(field=field), parallelism, placement, resources)

    @_operator(path_parameters=("tokenizer", "chat_template"))
    def tokenize_chat(
        self,
        tokenizer: Any,
        *,
        field: str = "messages",
        chat_template: str | None = None,
        loss_scope: LossScope = "all_assistant",
        span_source: SpanSource = "auto",
        tools_field: str | None = "tools",
        max_length: int | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        output_field: str = "input_ids",
        mask_field: str = "loss_mask",
        apply_chat_template: bool = True,
        eos_token: str | None = None,
        enable_thinking_field: str | None = "enable_thinking",
        image_grids: str | None = None,
        image_token: str = "<|image_pad|>",
        merge_size: int = 2,
        video_grids: str | None = None,
        video_token: str = "<|video_pad|>",
        parallelism: Parallelism | None = None,
        placement: Placement = "local",
        resources: Resources | None = None,
    ) -> Pipeline:
        """Render ``field`` with a chat template and tokenize it into ``output_field`` and
        ``mask_field`` (1 on supervised tokens); ``apply_chat_template=False`` tokenizes text
        that is already rendered; see docs/sft.md. ``image_grids``: the field of patch grids
        whose vision tokens replace the template's image placeholders; ``video_grids`` the
        same for video parts and ``video_token`` (docs/multimodal.md)."""
        op = TokenizeChatOp(
            tokenizer,
            field=field,
            chat_template=chat_template,
            loss_scope=loss_scope,
            span_source=span_source,
            tools_field=tools_field,
            max_length=max_length,
            chat_template_kwargs=chat_template_kwargs,
            output_field=output_field,
            mask_field=mask_field,
            apply_chat_template=apply_chat_template,
            eos_token=eos_token,
            enable_thinking_field=enable_thinking_field,
            image_grids=image_grids,
            image_token=image_token,
            merge_size=merge_size,
            video_grids=video_grids,
            video_token=video_token,
        )
        self._append(op, parallelism, placement, resources)
        self._measure_token_mixture(output_field)
        return self

    @_operator()
    def batch(self, microbatch_size: int, *, drop_last: bool = True) -> Pipeline:
        """Group each lane's records into ``SampleBatch`` es of ``microbatch_size``."""
        if self._batched:
            raise ConfigError("batch() can appear only once in a pipeline")
        self._append(BatchOp(microbatch_size, drop_last=drop_last), 1)
        self._batched = True
        return self

    # -- stateful operators: packing, shuffling, mixture correction (issue 5) ----------------

    @_operator()
    def pack_sequences(
        self,
        max_length: int,
        *,
        algorithm: PackingAlgorithm = "best_fit",
        num_bins: int = 16,
        min_sequence_length: int = 1,
        max_sequences_per_bin: int | None = None,
        drop_oversized: bool = True,
        flush_strategy: FlushStrategy = "fullest",
        tokens_field: str = "auto",
        length_fn: Callable[[Any], int] | None = None,
        candidate_pool_size: int = 256,
        max_candidate_age: int | None = None,
        homogeneity: Homogeneity = "none",
        groups: Mapping[str, str] | str | None = None,
        shuffle_strategy: ShuffleStrategy = "none",
        image_grids: str | None = None,
        merge_size: int = 2,
        max_images_per_row: int | None = None,
        image_token_id: int | None = None,
        max_vision_tokens_per_row: int | None = None,
        image_markers: tuple[int, int] | None = None,
        video_grids: str | None = None,
        video_token_id: int | None = None,
        parallelism: Parallelism | None = None,
        placement: Placement = "local",
        resources: Resources | None = None,
    ) -> Pipeline:
        """Pack records into ``{"packed_samples": [...]}`` envelopes of <= ``max_length`` tokens.

        ``homogeneity``: ``"full"`` keeps a bin inside one dataset, ``"group"`` inside one group
        of ``groups`` (a payload field, or ``{dataset: group}``); ``shuffle_strategy="length"``
        feeds each window of ``candidate_pool_size`` records longest first. See docs/packing.md.
        ``image_grids``: the field of patch grids whose vision tokens count toward a record's
        length (rows then carry ``cu_seqlens`` and an ``image_map``); with ``image_token_id``
        the vision tokens are already in the tokens, as runs of that id (``tokenize_chat``
        with ``image_grids``); ``max_vision_tokens_per_row`` caps a row's vision tokens (even
        work for the vision encoder); ``image_markers=(start, end)`` puts those token ids
        around each image (Qwen2-VL's ``<|vision_start|>``, ``<|vision_end|>``);
        ``video_grids`` (``decode_video``'s grids) counts a record's videos too, after its
        images (``video_token_id``: their runs in the tokens, with ``image_token_id``); see
        docs/multimodal.md.
        """
        op = PackSequencesOp(
            max_length,
            algorithm=algorithm,
            num_bins=num_bins,
            min_sequence_length=min_sequence_length,
            max_sequences_per_bin=max_sequences_per_bin,
            drop_oversized=drop_oversized,
            flush_strategy=flush_strategy,
            tokens_field=tokens_field,
            length_fn=length_fn,
            candidate_pool_size=candidate_pool_size,
            max_candidate_age=max_candidate_age,
            homogeneity=homogeneity,
            groups=groups,
            shuffle_strategy=shuffle_strategy,
            image_grids=image_grids,
            merge_size=merge_size,
            max_images_per_row=max_images_per_row,
            image_token_id=image_token_id,
            max_vision_tokens_per_row=max_vision_tokens_per_row,
            image_markers=image_markers,
            video_grids=video_grids,
            video_token_id=video_token_id,
            component_names=self.work_source.component_names(),
        )
        return self._append(op, parallelism, placement, resources)

    @_operator()
    def pack_flat(
        self,
        max_length: int,
        pad_token_id: int,
        *,
        algorithm: PackingAlgorithm = "best_fit",
        num_bins: int = 16,
        min_sequence_length: int = 1,
        max_sequences_per_bin: int | None = None,
        drop_oversized: bool = True,
        flush_strategy: FlushStrategy = "fullest",
        tokens_field: str = "auto",
        aligned_fields: Sequence[str] | Literal["auto"] = "auto",
        emit_positions: bool = True,
        candidate_pool_size: int = 256,
        max_candidate_age: int | None = None,
        homogeneity: Homogeneity = "none",
        groups: Mapping[str, str] | str | None = None,
        shuffle_strategy: ShuffleStrategy = "none",
        parallelism: Parallelism | None = None,
        placement: Placement = "local",
        resources: Resources | None = None,
    ) -> Pipeline:
        """Pack records into flat token rows padded to ``max_length`` (``positions``,
        ``document_ids`` and aligned fields alongside); ``batch.to_training()`` reads them.
        ``homogeneity``, ``groups`` and ``shuffle_strategy`` as in :meth:`pack_sequences`."""
        op = PackFlatOp(
            max_length,
            pad_token_id,
            algorithm=algorithm,
            num_bins=num_bins,
            min_sequence_length=min_sequence_length,
            max_sequences_per_bin=max_sequences_per_bin,
            drop_oversized=drop_oversized,
            flush_strategy=flush_strategy,
            tokens_field=tokens_field,
            aligned_fields=aligned_fields,
            emit_positions=emit_positions,
            candidate_pool_size=candidate_pool_size,
            max_candidate_age=max_candidate_age,
            homogeneity=homogeneity,
            groups=groups,
            shuffle_strategy=shuffle_strategy,
            component_names=self.work_source.component_names(),
        )
        return self._append(op, parallelism, placement, resources)

    @_operator()
    def shuffle(
        self,
        buffer_size: int = 8192,
        *,
        seed: int = 0,
        algorithm: ShuffleAlgorithm = "streaming",
        warmup_growth: float = 1.5,
        parallelism: Parallelism | None = None,
        placement: Placement = "local",
        resources: Resources | None = None,
    ) -> Pipeline:
        """Shuffle each lane within ``buffer_size`` records; randomness comes from the records'
        cursors and ``seed`` only (docs/shuffle-and-mixture.md)."""
        op = ShuffleOp(buffer_size, seed=seed, algorithm=algorithm, warmup_growth=warmup_growth)
        return self._append(op, parallelism, placement, resources)

    @_operator()
    def ensure_mixture(
        self,
        *,
        mixture: Mapping[str, float] | MixtureSpec | None = None,
        weight_by: str | Callable[[Any], float] = "samples",
        max_buffer_size: int | None = 1000,
        drain_target_ratio: float = 0.8,
        obsolete_drain_rate: float = 0.1,
        warn_tolerance: float | None = None,
        tokens_field: str = "auto",
    ) -> Pipeline:
        """Reorder each lane so its output tracks the target mixture (by dataset name; default:
        the source's mixture). ``max_buffer_size=None`` is strict mode: surplus is dropped."""
        names = self.work_source.component_names()
        explicit = mixture is not None
        if mixture is None:
            mixture = source_mixture(self.work_source)
            if mixture is None:
                raise ConfigError(
                    "ensure_mixture: the work source has no mixture; pass "
                    "mixture={dataset_name: weight, ...}"
                )
        weights = mixture.weights if isinstance(mixture, MixtureSpec) else mixture
        if getattr(mixture, "unit", "samples") == "tokens" and weight_by == "samples":
            raise ConfigError(
                "ensure_mixture: the mixture is in tokens but weight_by='samples' would steer "
                "sample counts; use ensure_mixture(weight_by='tokens')"
            )
        unknown = [k for k in weights if k not in names]
        if unknown:
            raise ConfigError(
                f"ensure_mixture: mixture names unknown dataset(s) {unknown}; the source's "
                f"datasets are {names}"
            )
        op = EnsureMixtureOp(
            {names.index(k): w for k, w in weights.items()},
            component_names=names,
            explicit=explicit,
            weight_by=weight_by,
            max_buffer_size=max_buffer_size,
            drain_target_ratio=drain_target_ratio,
            obsolete_drain_rate=obsolete_drain_rate,
            warn_tolerance=warn_tolerance,
            tokens_field=tokens_field,
        )
        return self._append(op, 1)

    @_operator()
    def stateful_transform(
        self,
        name: str,
        *,
        init_state: Any,
        push: Callable[[Any, Any], tuple[Any, Sequence[Any]]],
        flush: Callable[[Any], Any] | None = None,
        preserves_cursor_order: bool = True,
    ) -> Pipeline:
        """A per-lane state and a serial ``push(state, payload) -> (state, outputs)``.

        ``init_state`` (JSON-safe) starts every lane; ``outputs`` is a list of payloads (none
        drops the record, several fan out). ``flush(state) -> state`` runs when a lane's epoch
        or data ends. The state is saved in checkpoints, so restores continue exactly.
        """
        op = StatefulTransformOp(
            name,
            init_state=init_state,
            push=push,
            flush=flush,
            preserves_cursor_order=preserves_cursor_order,
        )
        return self._append(op, 1)

    @_operator(after_batch=True)
    def map_batch(
        self,
        fn: Callable[[SampleBatch], SampleBatch | None],
        *,
        parallelism: Parallelism | None = None,
        name: str | None = None,
        placement: Placement = "local",
        resources: Resources | None = None,
    ) -> Pipeline:
        """Apply ``fn`` to each ``SampleBatch`` (after ``batch``); ``None`` drops the batch."""
        return self._append(MapBatchOp(fn, name=name), parallelism, placement, resources)

    @_operator()
    def materialize(self) -> Pipeline:
        """A passthrough stage boundary: payloads are resolved there (from shared memory)."""
        return self._append(MaterializeOp(), 1)

    # -- group operators over a StreamingCaptureSource (zephon.capture.group_ops) ----------

    @_operator(path_parameters=("store",))
    def drop_equal_rewards(self, store: Any, *, name: str | None = None) -> Pipeline:
        """Drop each group whose rewards are all equal; its members are filtered in the prompt
        ledger of ``store`` (a capture store or its URL) with the reason."""
        from zephon.capture.group_ops import DropEqualRewards

        return self.add_op(DropEqualRewards(store, name=name))

    @_operator(path_parameters=("store",))
    def keep_per_prompt(self, store: Any, k: int, *, name: str | None = None) -> Pipeline:
        """Keep the first ``k`` members of each group; the others are filtered in the prompt
        ledger of ``store`` (a capture store or its URL)."""
        from zephon.capture.group_ops import KeepPerPrompt

        return self.add_op(KeepPerPrompt(store, k, name=name))

    @_operator(path_parameters=("store",))
    def difficulty_pool(
        self, store: Any, low: float, high: float, *, name: str | None = None
    ) -> Pipeline:
        """Keep each group whose mean reward lies in ``[low, high]``; the members of the
        others are filtered in the prompt ledger of ``store`` (a capture store or its URL)."""
        from zephon.capture.group_ops import DifficultyPool

        return self.add_op(DifficultyPool(store, low, high, name=name))

    def add_op(
        self,
        op: BaseOp,
        /,
        *,
        parallelism: Parallelism | None = None,
        placement: Placement = "local",
        resources: Resources | None = None,
    ) -> Pipeline:
        """Append a custom operator (a :class:`zephon.ops.BaseOp` subclass instance)."""
        if not isinstance(op, BaseOp):
            raise ConfigError(f"add_op needs a BaseOp instance, got {type(op).__name__}")
        return self._append(op, parallelism, placement, resources)

    def options(self, **options: Any) -> Pipeline:
        """Set runtime options (see :class:`zephon.options.RuntimeOptions`); returns self."""
        self._options = self._options.updated(**options)
        return self

    # -- for zephon.testing: vary one property of an otherwise identical pipeline ----------

    def _override_last_parallelism(self, width: int) -> None:
        """Run the last operator on ``width`` workers (the output must not change)."""
        if self._specs:
            spec = self._specs[-1]
            self._specs[-1] = replace(spec, parallelism=max(1, width), auto=False)

    def _drop_last_op(self) -> None:
        """Remove the last operator: what is left produces that operator's input."""
        if not self._specs:
            raise ConfigError("the pipeline has no operator after fetch to check")
        if isinstance(self._specs.pop().op, BatchOp):
            self._batched = False

    # -- running ---------------------------------------------------------------------------

    @property
    def runtime_options(self) -> RuntimeOptions:
        return self._options

    def _all_specs(self) -> list[OpSpec]:
        on_error = self._fetch_on_error or self._options.on_error
        fetch = FetchOp(
            self.work_source.datasets, max_batch=self._fetch_max_batch, on_error=on_error
        )
        width = checked_width("fetch", self._fetch_parallelism, fetch.traits().parallelism)
        first = OpSpec(
            fetch, width or 1, self._fetch_placement, self._fetch_resources, auto=width is None
        )
        specs = [_with_on_error(spec, on_error) for spec in self._specs]
        return [first, *specs]

    def explain(self) -> Plan:
        """The compiled plan: stages, runners, parallelism, queue sizes (``str()`` for text)."""
        return compile_run(self.work_source, self._all_specs(), self._options).plan

    def operators(self) -> Sequence[BaseOp]:
        return [s.op for s in self._all_specs()]

    def __iter__(self) -> Iterator[StreamItem]:
        yield from self._run(None, self._options.engine_process)

    def iter_training(
        self,
        transform: Callable[[StreamItem], Any] | None = None,
        /,
        *,
        engine_process: bool | None = None,
        pin_memory: bool = False,
        **to_training: Any,
    ) -> Iterator[Any]:
        """Iterate model inputs: ``batch.to_training(**to_training)`` (or ``transform(batch)``)
        of each delivered item, built outside the training process.

        The engine runs in a child process (``engine_process=None``: whenever the runner can,
        see the ``engine_process`` option) and builds the inputs there, so this process only
        maps them: every array and CPU tensor of an item arrives in one shared-memory block,
        as the same dtypes, shapes and values, without a copy. ``pin_memory=True`` copies each
        item into one page-locked block when CUDA is available (tensors ready for
        ``.to("cuda", non_blocking=True)``; without CUDA it does nothing). ``checkpoint()`` is
        the position right after the last inputs received, as for ``iter(pipeline)``.
        ``transform`` must pickle (cloudpickle) when it runs in the engine process.
        """
        if transform is None:
            from zephon.training import TrainingOptions
            from zephon.training import to_training as build

            TrainingOptions(**to_training)  # a wrong keyword is refused here, not per batch
            transform = functools.partial(build, **to_training)
        elif to_training:
            raise ConfigError(
                f"iter_training: pass a transform or to_training keywords, not both (got "
                f"{sorted(to_training)} with {transform!r})"
            )
        if engine_process is None:
            engine_process = self._options.runner in ENGINE_PROCESS_RUNNERS
        items = self._run(transform, engine_process)
        if not pin_memory:
            return items
        from zephon._shared_batch import pinned_items

        return pinned_items(items)

    def _run(
        self, transform: Callable[[StreamItem], Any] | None, engine_process: bool
    ) -> Iterator[Any]:
        """The items (as ``transform`` makes them, in the engine process when there is one)."""
        if not self._engine_done:
            raise RuntimeError(
                "this pipeline is already being iterated; finish or close that iterator first"
            )
        if not self._epoch_chosen and self._resume is None:
            log.warning(
                "zephon: this pipeline is iterated again at epoch %d without set_epoch(): it "
                "delivers that epoch again from its start, in the same order. Call "
                "pipeline.set_epoch(n) before each pass for a new order (set_epoch(%d) to "
                "repeat it on purpose without this warning).",
                self._epoch,
                self._epoch,
            )
        self._epoch_chosen = False
        specs = self._all_specs()
        fetch = specs[0].op
        assert isinstance(fetch, FetchOp)
        fetch.pin_files()
        run = compile_run(self._source(), specs, self._options, self._resume)
        engine: Engine | EngineProcess | LaneWorkers
        if run.plan.lane_workers:
            engine = LaneWorkers(run, transform)
        elif engine_process:
            engine = EngineProcess(run, transform)
        else:
            engine = Engine(run)
        transform_here = None if run.plan.lane_workers or engine_process else transform
        engine.interrupt = self._interrupt
        self._resume = None
        self._engine = engine
        self._engine_done = False
        self.last_stats = engine.stats
        origin = self.provenance_origin()
        try:
            for item in engine:
                if isinstance(item, SampleBatch):
                    item._origin = origin
                yield item if transform_here is None else transform_here(item)
        finally:
            self._engine_done = True

    def interrupt_when(self, check: Callable[[], bool] | None) -> Pipeline:
        """Let ``check()`` stop an iteration that waits for its next item.

        While the iteration waits for an item (a stalled store, a stuck operator), it calls
        ``check()`` four times a second; once it returns True the iteration raises
        :class:`~zephon.errors.WaitInterrupted`. Nothing is in transit then:
        :meth:`checkpoint` is the state after the last item delivered, so a process asked to
        stop (SIGTERM) can save it and exit without waiting for the stall to end. Every
        runner and ``engine_process=True`` ask it; the inline runner runs the operators on
        the calling thread, so it asks between their calls (not during one that never
        returns). ``zephon run`` sets it to "a stop signal arrived". None removes it.
        """
        self._interrupt = check
        return self

    # -- epochs ----------------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        """The pass over the data the next (or current) iteration delivers; 0 at first."""
        return self._epoch

    def _source(self) -> WorkSource:
        return self.work_source.with_epoch(self._epoch)

    def set_epoch(self, epoch: int) -> Pipeline:
        """Make the next iteration pass ``epoch`` over the data: every item once, in an order
        of its own (shard, row and chunk orders and shuffle seeds are keyed by the epoch),
        the same in every run. The epoch is part of checkpoints and of their fingerprint.

        After ``restore()`` the pipeline is at the checkpoint's epoch; setting another one
        drops a checkpoint whose epoch was complete and refuses one that was not. Lanes the
        checkpoint saved in a later pass (ranks of uneven lengths) continue when their pass
        is set.
        """
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ConfigError(f"set_epoch: epoch must be an integer >= 0, got {epoch!r}")
        if not self._engine_done:
            raise RuntimeError(
                "set_epoch() must be called between iterations; this pipeline is being iterated"
            )
        self.work_source.with_epoch(epoch)  # a source without epochs refuses here
        resume = self._resume
        if resume is not None and resume.epoch != epoch:
            if not resume.finished_for(view_lanes(self._options)):
                raise CheckpointError(
                    f"set_epoch({epoch}): the restored checkpoint is in the middle of epoch "
                    f"{resume.epoch}; call set_epoch({resume.epoch}) (or leave it) to finish "
                    f"that epoch first, or build a new pipeline to start epoch {epoch} afresh"
                )
            self._resume = None  # that epoch was complete: the new one starts at its beginning
        if self._later and self._resume is None:
            state = start_of_pass(self.pass_start(epoch), epoch, self._later)
            assert state is not None
            self._resume, self._later = split_later(ckpt.parse(state), view_lanes(self._options))
        self._engine = None  # checkpoint() now describes the start of that pass
        self._epoch = epoch
        self._epoch_chosen = True
        return self

    def pass_start(self, epoch: int) -> dict[str, Any]:
        """This view's checkpoint at the start of pass ``epoch`` (nothing delivered yet),
        whatever this pipeline restored or iterated."""
        source = self.work_source.with_epoch(epoch)
        engine = Engine(compile_run(source, self._all_specs(), self._options, None))
        engine.prepare()
        return engine.checkpoint()

    def pass_length(self, epoch: int | None = None) -> int:
        """How many items (batches, after ``batch()``) this view delivers in pass ``epoch``
        (default: :attr:`epoch`), from the start of that pass.

        Ranks hold different lanes, so their passes differ in length; a training loop that
        stops at ``max_steps`` sizes it with this. The count is exact because it runs the
        pass: it costs one pass of this rank's pipeline without the training (reading,
        tokenizing, packing), on this pipeline's runner. The result is kept, so asking again
        for the same pass and lanes is free.
        """
        epoch = self._epoch if epoch is None else epoch
        key = (epoch, tuple(view_lanes(self._options)))
        if key not in self._pass_lengths:
            counter = copy.copy(self)  # the same operators and options, none of its state
            counter._engine, counter._engine_done, counter._resume = None, True, None
            counter._later, counter._pass_lengths = {}, {}
            counter.set_epoch(epoch)
            self._pass_lengths[key] = sum(1 for _ in counter)
        return self._pass_lengths[key]

    def provenance_origin(self) -> Any:
        """Names, files and lines of this pipeline's datasets (``zephon.provenance.Origin``),
        which delivered batches carry for :meth:`SampleBatch.provenance`."""
        if self._origin is None:
            from zephon.provenance import Origin

            decoders = [s.op for s in self._specs if isinstance(s.op, DecodeImageOp)]
            decoders = [op for op in decoders if op.media == "image"]
            fields = decoders[0].fields if decoders else None
            self._origin = Origin(
                self.work_source.datasets, inputs=self._stage_inputs, image_fields=fields
            )
        return self._origin

    def _stage_inputs(self) -> Any:
        """Re-runs records up to a stage: provenance asks it for the whole length of the
        documents truncation cut."""
        from zephon._engine.plan.stage_inputs import StageInputs

        return StageInputs(compile_run(self._source(), self._all_specs(), self._options, None))

    # -- checkpoints -----------------------------------------------------------------------

    def checkpoint(self, *, held_records: bool = False) -> dict[str, Any]:
        """What this rank has delivered so far, as a small, versioned, JSON-safe dict.

        Call it between batches (it reflects exactly the items you have received). Before the
        first batch it describes the start (or the pending restore).

        ``held_records=True`` also writes the payloads of the records that shuffle, packing
        and mixture buffers hold (token ids and every other field), so a restore reads them
        from the checkpoint instead of fetching and tokenizing their sources again: a larger
        checkpoint (a format version 5 file) for a faster restore. Meant for checkpoint files
        (``zephon run`` writes them so); the default stays small for per-step checkpoints.
        """
        engine = self._engine
        if engine is None or self._resume is not None or not engine.prepared:
            run = compile_run(self._source(), self._all_specs(), self._options, self._resume)
            engine = Engine(run)
            engine.prepare()
        state = engine.checkpoint(held_records=held_records)
        return with_lanes(state, self._later) if self._later else state

    def _mark(self) -> Callable[[], dict[str, Any]]:
        """The checkpoint of the position now, built only when called (taking the mark costs
        no encoding): for a consumer that keeps a position per item it hands out and asks
        for few of them (``PipelineDataLoader(history=...)``). Taken while iterating."""
        engine, later = self._engine, self._later
        if engine is None or not engine.prepared:
            raise CheckpointError("a position mark is taken after an item was received")
        position = engine.position()

        def build() -> dict[str, Any]:
            state = engine.checkpoint_at(position)
            return with_lanes(state, later) if later else state

        return build

    def restore(self, state: Mapping[str, Any]) -> Pipeline:
        """Resume from ``state`` at the next iteration; validated now, applied at ``iter()``.

        The state may come from another number of data-parallel ranks (merged with
        :func:`zephon.merge_checkpoints`) as long as ``canonical_replicas`` is the same. The
        pipeline takes the checkpoint's epoch (:attr:`epoch`); lanes it saved in a later pass
        count as finished in that one and continue at ``set_epoch`` of theirs.
        """
        if not self._engine_done:
            raise RuntimeError(
                "restore() must be called before iterating; this pipeline is being iterated"
            )
        parsed, later = split_later(ckpt.parse(state), view_lanes(self._options))
        source = self.work_source.with_epoch(parsed.epoch)
        check_restore(source, self._all_specs(), self._options, parsed)
        fingerprints: dict[int, str] = {}  # each later pass's configuration, as this pipeline's
        for lane, lc in sorted(later.items()):
            assert lc.epoch is not None
            if lc.epoch not in fingerprints:
                source = self.work_source.with_epoch(lc.epoch)
                fingerprints[lc.epoch] = config_fingerprint(
                    source, self._all_specs(), self._options
                )
            if lc.fingerprint != fingerprints[lc.epoch]:
                raise CheckpointError(
                    f"checkpoint lane {lane} was saved in epoch {lc.epoch} with another "
                    "configuration than this pipeline's; restore with the pipeline that took it"
                )
        self._resume = parsed
        self._later = later
        self._epoch = parsed.epoch
        self._epoch_chosen = True
        self._engine = None
        return self

    def to_torch_dataset(
        self,
        transform: Callable[[Any], Any] | None = None,
        *,
        rows: bool = False,
        endless: bool = False,
        accumulation_steps: int = 1,
    ) -> Any:
        """A torch ``IterableDataset`` with ``state_dict``/``load_state_dict`` (needs torch).

        Use it with ``torchdata.stateful_dataloader.StatefulDataLoader(ds, batch_size=None,
        collate_fn=...)``; ``transform`` converts each item (e.g. ``SampleBatch.to_training``).
        ``rows=True`` yields single rows of each transformed batch (by default Hugging Face
        tensors, ``to_training(convention="hf")``) for a DataLoader that batches itself.
        ``endless=True``: one iteration goes on from pass to pass (each the next epoch), for
        data-parallel ranks whose passes differ in length; the loop's step limit ends it.
        ``accumulation_steps=n``: each pass in whole groups of ``n`` batches (one optimizer
        step), the fewer left at a pass end left out of it, so no step spans two passes.
        """
        from zephon.torch_data import PipelineDataset

        return PipelineDataset(
            self, transform, rows=rows, endless=endless, accumulation_steps=accumulation_steps
        )

    def stats(self) -> RunStats | None:
        """Live statistics of the current (or last) iteration: totals, per-operator
        throughput, worker vs accumulator time, queue depths, backpressure stalls and
        per-lane progress. ``None`` before the first iteration."""
        if self._engine is None:
            return self.last_stats
        return self._engine.snapshot()


def _with_on_error(spec: OpSpec, on_error: Literal["raise", "skip"]) -> OpSpec:
    """``spec`` with a ``decode_image`` (or ``decode_video``) that follows the run's
    ``on_error`` when it names none."""
    op = spec.op
    if not isinstance(op, DecodeImageOp) or op.on_error is not None:
        return spec
    resolved = copy.copy(op)
    resolved.on_error = on_error
    return replace(spec, op=resolved)
