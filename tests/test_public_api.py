"""Every public module has ``__all__``, and each public namespace exports exactly these names.

A change to a list here is a change to the public API: make it deliberately, with a changelog
entry. Public modules are those without a leading underscore anywhere in their dotted path.

Each object is exported by one module, its home: the root ``zephon`` for the names it lists,
else a package for the names its ``__init__`` gathers from its modules, else the module that
defines it. Other modules may still import it (``from zephon.types import SampleRecord``
works), but their ``__all__`` leaves it out, so there is one place to look it up.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"


def _names(text: str) -> list[str]:
    """The names of a space-separated literal (one namespace's exports, sorted)."""
    return text.split()


EXPECTED: dict[str, list[str]] = {
    "zephon": _names(
        "CacheOptions Dataset MixtureSchedule MixtureSpec Pipeline SampleBatch SampleMeta "
        "SampleRecord StaticMixtureWorkSource TokenCalibration WorkChunk WorkSource __version__ "
        "gather_checkpoints merge_checkpoints trace"
    ),
    "zephon.capture": _names(
        "BuildNotes BuildOutput CallRecord CaptureLedgerCommit CaptureRecordError Chain ChainLink "
        "ConformanceError "
        "ConformanceReport ConformanceWarning EngineRefusalRecord FINGERPRINT_VERSION FileStore "
        "IncrementalResolver LedgerTransitionError LogCorruptionError ManifestFailure "
        "MemoryStore ParentResolutionStatus PostgresStore PromptState RolloutBuild "
        "RolloutLineage RolloutManifest RolloutRemoval RolloutScore STORE_SCHEMES SqliteStore "
        "StreamLedger TerminalAttribution TokenCaptureSnapshot TokenEntry Trajectory "
        "assistant_fingerprint attribute_terminal build_rollout canonicalize_tool_arguments "
        "compute_digest conversation_digest cumulative_tokens encode_token_ids open_store "
        "prefix_merging run_conformance run_conformance_sync stamp_continuation"
    ),
    "zephon.capture.builder": _names(""),
    "zephon.capture.conformance": _names("CHECKS CheckResult"),
    "zephon.capture.dataset": _names("CaptureSource RetirementReport TrajectoryShard"),
    "zephon.capture.ledger": _names(
        "Admission LedgerDelta MAX_STREAM_CHARS MemberRef PromptMember PromptRow member_rollout_id "
        "validate_stream"
    ),
    "zephon.capture.lineage": _names(
        "EntryFetch LineageNode chain_hint_item has_model_authored_item resolve_among "
        "resolve_from_ledger split_chain_hint token_prompt_chain_of token_prompt_item "
        "token_prompt_of"
    ),
    "zephon.capture.protocols": _names(
        "CaptureAdmissionRefused CaptureConflictError CaptureHistoryUnrepresentable "
        "CaptureLedger CaptureOrderError CaptureStore LineageMatch LineageResolution "
        "LineageResolver PromptLedger RolloutRetiredError "
        "SupportsBeginCall SupportsCloseAdmissions SupportsEngineRefusal SupportsFailCall "
        "SupportsPeek SupportsRefuseCall SupportsScores TokenCaptureFrozenError "
        "TokenCaptureRequestRefused TokenCaptureRetiredError TokenSink TokenSource"
    ),
    "zephon.capture.proxy": _names("CONFIG_ENV ProxyConfig create_app serve"),
    "zephon.capture.proxy.app": _names(
        "CAPTURE_SEGMENT CAPTURE_TOKEN_HEADER CONTROL_PREFIX create_app_from_env"
    ),
    "zephon.capture.proxy.server": _names("bind_socket exposure_problem"),
    "zephon.capture.rl": _names("PromptGroup PromptSource view_stream"),
    "zephon.capture.streaming": _names("LOG_SUFFIX StreamingCaptureSource"),
    "zephon.capture.store_handle": _names("StoreHandle"),
    "zephon.capture.group_ops": _names("DifficultyPool DropEqualRewards KeepPerPrompt store_at"),
    "zephon.capture.batching": _names("StepBatcher StepBudget TrainStep"),
    "zephon.capture.scores": _names(""),
    "zephon.capture.records": _names(
        "DIGEST_VERSION GROUP_FIELD MAX_CALL_ID_CHARS MAX_TOKEN_ID SampleGroup "
        "TOKEN_ENTRY_MIN_SCHEMA_VERSION TOKEN_ENTRY_RECORD_SCHEMA_VERSION canonical_json "
        "entry_key require_finite validate_call_id validate_capture_keys validate_rollout_id"
    ),
    "zephon.capture.stores": _names(
        "FileSystem STORE_CLASSES StoreSpec register_store store_class store_spec "
        "store_specs stores_markdown unregister_store url_forms"
    ),
    "zephon.capture.stores.base": _names(
        "Cursor Decide Delete DurableStore Event Offload Put Retire RolloutState SqlStore "
        "StreamOp Then Transition decide_stream parse_offload transition_result"
    ),
    "zephon.capture.testing": _names(
        "ChaosError ChaosRole FloodPlan FloodReport Image MUTATIONS Mutation Op "
        "ProcessRole RecordingFileSystem STORE_KINDS StoreKind Wrapper "
        "assert_mutation_caught durable_kinds ledger_progress marks_before "
        "mutated_factory power_loss_images run_chaos run_flood run_mutation sample_commit "
        "store_kinds"
    ),
    "zephon.checkpoints": _names(
        "CHECKPOINT_RE CheckpointWriteError LaneCheckpoint LatestCheckpoint OperatorInfo "
        "ParsedCheckpoint REJECTED_SUFFIX SourceInfo checkpoint_files checkpoint_path "
        "delivered_counts latest_checkpoint load_checkpoint parse_checkpoint refetch_counts "
        "save_checkpoint seal"
    ),
    "zephon.checkpoints.files": _names(""),
    "zephon.checkpoints.format": _names(
        "CHECKSUM_KEY FORMAT HELD_PAYLOADS_VERSION LANE_EPOCHS_VERSION PLAIN_VERSION VERSION "
        "build checksum cursor_from_json cursor_to_json fingerprint first_difference "
        "lanes_version migrate to_jsonable verify_checksum"
    ),
    "zephon.checkpoints.gather": _names(""),
    "zephon.checkpoints.passes": _names("any_pass split_later start_of_pass with_lanes"),
    "zephon.cli": _names("build_parser main"),
    "zephon.config": _names(
        "ConfigFileError OPERATORS OperatorDefinition OperatorParameter PipelineConfig "
        "load_config operator_definition operator_definitions operators_markdown parse_config"
    ),
    "zephon.convert": _names("ConvertResult ConvertStopped convert"),
    "zephon.demo": _names("add_arguments closing_lines make_corpus run run_from_argv"),
    "zephon.distributed": _names("exit_rank"),
    "zephon.errors": _names(
        "CacheThrashingWarning ChatFormatError CheckpointError ConfigError ContractError "
        "DataError DataFormatError MissingDependencyError MissingFieldError OUT_OF_MEMORY_FIX "
        "ReorderError WaitInterrupted ZephonError did_you_mean json_type"
    ),
    "zephon.io": _names(
        "FormatSpec InMemoryShard JsonlShard NodeCache ReadOptions Row Shard SourceStats "
        "abandon_reads build_index cache_root format_names format_spec formats formats_markdown "
        "io_totals list_shards megatron_blend open_requests register_format token_chunks "
        "token_packs unregister_format"
    ),
    "zephon.metrics": _names("MetricsReporter MetricsSink StatsdSink metric_values parse_address"),
    "zephon.ops": _names(
        "Accumulator BaseOp CountingAccumulator HoldsRecords LaneStateful LazyPayloads "
        "MarkerObserver MicroBatch OpContext OpTraits PassthroughAccumulator PendingTarget "
        "Reassembles Rebuild check_accumulator cut_note spawn_child tombstone_meta "
        "tombstones_for_record"
    ),
    "zephon.ops.accumulators": _names(""),
    "zephon.ops.state": _names("holds_records payloads_lazy"),
    "zephon.options": _names("RUNNERS RunnerName RuntimeOptions default_workers"),
    "zephon.pipeline": _names("OPERATOR_METHODS Placement"),
    "zephon.provenance": _names(
        "BatchProvenance Divergence FIND_FORMS Hit ImageSource Origin ProvenanceLog Segment "
        "TraceResult "
        "batch_provenance content_fingerprint diff find parse_query raw_segments read_log "
        "restore_before run_dataset_names"
    ),
    "zephon.testing": _names(
        "CheckReport OperatorCheckError check_operator item_key run_with_stops"
    ),
    "zephon.torch_data": _names(
        "GROUP_STATE_FORMAT PipelineDataset ROWS_STATE_FORMAT hf_tensors worker_pipeline"
    ),
    "zephon.torch_loader": _names("LOADER_STATE_FORMAT PipelineDataLoader merge_loader_states"),
    "zephon.training": _names(
        "CONVENTIONS TOKEN_FIELDS TrainingOptions to_training training_arrays"
    ),
    "zephon.integrations": _names(""),
    "zephon.integrations.accelerate": _names(
        "DataState TokenLoss evaluate_loss loss_tokens prepare_eval_pipeline prepare_pipeline"
    ),
    "zephon.integrations.lightning": _names("ZephonDataModule"),
    "zephon.integrations.megatron": _names(
        "MegatronDataProvider accumulation_steps bshd_batch datasets_provider load_generation "
        "rank_file_name reads_data thd_batch thd_pad_multiple"
    ),
    "zephon.integrations.torchtitan": _names(
        "IGNORE_INDEX STATE_FORMAT ZephonDataLoader load_pipeline titan_batch"
    ),
    "zephon.integrations.trl": _names("CapturedRollouts"),
    "zephon.integrations.transformers": _names(
        "DATA_STATE_NAME PreemptionCallback ZephonTrainer latest_complete_checkpoint"
    ),
    "zephon.types": _names(
        "ChunkId ChunkOffset ContributorRef Control EndOfData FlushSentinel LaneId LineagePath "
        "RESERVED_TAGS SampleCursor SampleId SnapshotMarker StreamItem TAG_BOUNDARY_CID "
        "TAG_CONTRIBUTORS TAG_CUT_TOKENS TAG_DROPPED_TOKENS TAG_END_OF_DATA TAG_ERROR "
        "TAG_FLUSH_SENTINEL TAG_PACKING TAG_SKIPPED TAG_SNAPSHOT TAG_SNAPSHOT_REPLAY "
        "TAG_TARGET_MIXTURE TAG_TOMBSTONE Tombstone end_of_data flush_sentinel is_control "
        "record_tokens records_of snapshot_marker"
    ),
    "zephon.work": _names(
        "ExhaustedPolicy FingerprintedSource LaneAssignment LaneMapping MixtureSource "
        "MixtureStats SeededSource TokenMeasuredSource lanes_for_rank source_fingerprint "
        "source_mixture source_seed"
    ),
}


def _public_modules() -> list[str]:
    out = []
    for path in sorted(SRC.rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        if parts[-1] == "__main__" or any(p.startswith("_") for p in parts):
            continue
        out.append(".".join(parts))
    return out


def test_every_public_module_is_pinned() -> None:
    assert sorted(_public_modules()) == sorted(EXPECTED)


@pytest.mark.parametrize("module", sorted(EXPECTED))
def test_public_exports(module: str) -> None:
    mod = importlib.import_module(module)
    assert hasattr(mod, "__all__"), f"{module} has no __all__"
    assert sorted(mod.__all__) == EXPECTED[module]
    assert len(set(mod.__all__)) == len(mod.__all__), f"{module}.__all__ repeats a name"
    missing = [n for n in mod.__all__ if not hasattr(mod, n)]
    assert missing == [], f"{module}.__all__ names what it does not define: {missing}"


def _key(name: str, value: object) -> object:
    """What makes two exports the same: the object for zephon's own functions, classes and
    modules; the name with the object for plain values (equal small ints are one object)."""
    if getattr(value, "__module__", "").startswith("zephon") or isinstance(value, ModuleType):
        return id(value)
    return (name, id(value))


def test_each_object_is_exported_by_one_module() -> None:
    homes: dict[object, list[str]] = {}
    for module in sorted(EXPECTED):
        mod = importlib.import_module(module)
        for name in mod.__all__:
            homes.setdefault(_key(name, getattr(mod, name)), []).append(f"{module}.{name}")
    twice = [paths for paths in homes.values() if len({p.rpartition(".")[0] for p in paths}) > 1]
    assert twice == []
