"""zephon's Megatron-LM external data provider with real megatron-core on the CPU: the batch keys
(padded and packed THD), the batch-size and rank refusals, Megatron's ``RerunDataIterator`` replay,
and the rank files: a 2-rank gloo job SIGKILLed after a save resumes on 1, 2 and 4 DP ranks with
every sample trained once (the 2-rank resume bit for bit), and damaged generations are refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.integrations._corpus import build_pipeline
from tests.integrations._launch import (
    JOB_TIMEOUT_S,
    json_lines,
    run_job,
    run_until_parked_then_kill,
    torchrun_argv,
)
from tests.integrations._megatron_corpus import GLOBAL, MICRO, batch_line
from tests.integrations._megatron_job import PARK_AT
from tests.integrations._megatron_save import (
    RerunMode,
    get_rerun_state_machine,
    rank_file,
    training_iterator,
)
from tests.integrations._steps import assert_each_step, reference_steps, trained
from zephon import Dataset, MixtureSpec, Pipeline, StaticMixtureWorkSource
from zephon.errors import CheckpointError, ConfigError
from zephon.integrations.megatron import (
    MegatronDataProvider,
    accumulation_steps,
    load_generation,
    reads_data,
    thd_pad_multiple,
)

SCRIPT = "_megatron_job.py"
STEPS = 9


def short_docs_pipeline() -> Pipeline:
    """Rows of 64 tokens holding several short documents each, 2 rows a batch."""
    rows = [{"text": f"d{i} " + "ab" * (3 + i % 9)} for i in range(200)]
    source = StaticMixtureWorkSource(
        datasets=[Dataset.from_records("docs", rows)],
        mixture=MixtureSpec({"docs": 1.0}),
        chunk_size=16,
        seed=3,
    )
    return (
        Pipeline(source)
        .decode_text()
        .tokenize("bytes", max_length=64)
        .pack_flat(64, pad_token_id=0)
        .options(runner="inline", canonical_replicas=4)
        .batch(2)
    )


def first_batch() -> Any:
    return next(iter(short_docs_pipeline()))


def test_padded_batch_has_megatrons_keys_with_documents_kept_apart() -> None:
    item = first_batch()
    out = item.to_training(convention="shifted")
    provider = MegatronDataProvider(short_docs_pipeline(), micro_batch_size=2, global_batch_size=2)
    batch = next(provider)
    assert set(batch) == {"tokens", "labels", "loss_mask", "attention_mask", "position_ids"}
    assert torch.equal(batch["tokens"], torch.from_numpy(out["input_ids"].astype(np.int64)))
    assert torch.equal(batch["position_ids"], torch.from_numpy(out["positions"]))
    mask = batch["loss_mask"].numpy()
    assert np.array_equal(mask, out["loss_mask"])
    docs = out["document_ids"]
    assert len(set(docs[0]) - {-1}) > 2  # several documents in a row
    labels = batch["labels"].numpy()
    assert np.array_equal(labels[mask > 0], out["labels"][mask > 0])
    assert (labels[mask == 0] == 0).all()
    blocked = batch["attention_mask"].numpy()[:, 0]  # True: may not attend
    for row in range(2):
        for q, k in [(q, k) for q in range(64) for k in range(64)]:
            allowed = k <= q and docs[row, q] == docs[row, k]
            assert blocked[row, q, k] == (not allowed)


def test_thd_batch_packs_each_document_padded_to_the_multiple() -> None:
    item = first_batch()
    out = item.to_training(convention="shifted")
    provider = MegatronDataProvider(
        short_docs_pipeline(), micro_batch_size=1, global_batch_size=1, thd=True, pad_multiple=8
    )
    batch = next(provider)
    assert batch["attention_mask"] is None
    cu, cu_padded = batch["cu_seqlens"][0].numpy(), batch["cu_seqlens_padded"][0].numpy()
    assert batch["cu_seqlens"].dtype == batch["cu_seqlens_padded"].dtype == torch.int32
    lengths, widths = np.diff(cu), np.diff(cu_padded)
    assert (widths % 8 == 0).all() and (widths >= lengths).all() and (widths - lengths < 8).all()
    assert batch["tokens"].shape == (1, int(cu_padded[-1]))
    assert int(batch["max_seqlen"][0]) == int(widths.max())
    docs = [out["input_ids"][r][out["document_ids"][r] == d] for r in range(2)
            for d in dict.fromkeys(out["document_ids"][r]) if d >= 0]  # fmt: skip
    assert [len(d) for d in docs] == list(lengths)
    tokens, positions = batch["tokens"][0].numpy(), batch["position_ids"][0].numpy()
    loss = batch["loss_mask"][0].numpy()
    for doc, start, length, width in zip(docs, cu_padded[:-1], lengths, widths, strict=True):
        assert np.array_equal(tokens[start : start + length], doc)
        assert (tokens[start + length : start + width] == 0).all()
        assert np.array_equal(positions[start : start + width], np.arange(width))
        assert (loss[start + length - 1 : start + width] == 0).all()  # no target past the doc
        assert np.array_equal(batch["labels"][0].numpy()[start : start + length - 1], doc[1:])


@pytest.mark.parametrize(
    ("tp", "cp", "sp", "multiple"),
    [(1, 1, False, 1), (4, 1, False, 1), (4, 1, True, 4), (1, 2, False, 4), (2, 4, True, 16)],
)
def test_thd_pad_multiple_serves_context_and_sequence_parallelism(
    tp: int, cp: int, sp: bool, multiple: int
) -> None:
    assert (
        thd_pad_multiple(tensor_parallel=tp, context_parallel=cp, sequence_parallel=sp) == multiple
    )


def test_global_batch_size_is_micro_times_dp_times_accumulation_or_refused() -> None:
    assert accumulation_steps(global_batch_size=32, micro_batch_size=2, data_parallel_size=4) == 4
    with pytest.raises(ConfigError, match=r"global_batch_size=10 .* use a multiple of 8"):
        accumulation_steps(global_batch_size=10, micro_batch_size=2, data_parallel_size=4)
    with pytest.raises(ConfigError, match="global_batch_size=4"):
        MegatronDataProvider(build_pipeline(), micro_batch_size=2, global_batch_size=4,
                             dp_rank=0, dp_world_size=4)  # fmt: skip


def test_micro_batch_size_must_match_the_pipeline_batch_and_be_one_for_thd() -> None:
    provider = MegatronDataProvider(build_pipeline(), micro_batch_size=4, global_batch_size=4)
    with pytest.raises(ConfigError, match=r"holds 2 rows but micro_batch_size is 4.*\.batch\(4\)"):
        next(provider)
    with pytest.raises(ConfigError, match="--micro-batch-size 1"):
        MegatronDataProvider(build_pipeline(), micro_batch_size=2, global_batch_size=2, thd=True)


def test_next_is_called_on_tensor_rank_zero_of_the_first_and_last_stage_only() -> None:
    reading = {
        (tp, pp) for tp in range(2) for pp in range(4)
        if reads_data(tensor_rank=tp, pipeline_rank=pp, pipeline_size=4)
    }  # fmt: skip
    assert reading == {(0, 0), (0, 3)}
    assert reads_data(tensor_rank=0, pipeline_rank=0, pipeline_size=1)


@pytest.mark.timeout(2 * JOB_TIMEOUT_S)
def test_only_tensor_rank_zero_of_the_first_and_last_stage_gets_the_same_data(
    tmp_path: Path,
) -> None:
    run_job(torchrun_argv(SCRIPT, tmp_path, "layout", 2, 2, nproc=4), tmp_path)
    seen = [json.loads((tmp_path / f"layout-r{rank}.json").read_text()) for rank in range(4)]
    reading = {(x["tp"], x["pp"]) for x in seen if x["first"] is not None}
    assert reading == {(0, 0), (0, 1)}
    firsts = [x["first"] for x in seen if x["first"] is not None]
    assert firsts[0] == firsts[1] == reference_rank(0, 1, 1)[0]  # DP 1: one batch of each lane


def test_rerun_replay_returns_the_same_batches_without_moving_the_position() -> None:
    machine = get_rerun_state_machine()
    mode = machine.get_mode()
    machine.set_mode(RerunMode.VALIDATE_RESULTS)  # Megatron keeps each iteration's batches
    try:
        provider = MegatronDataProvider(build_pipeline(), micro_batch_size=MICRO,
                                        global_batch_size=GLOBAL)  # fmt: skip
        iterator = training_iterator(provider)
        first = [batch_line(next(iterator)) for _ in range(provider.accumulation_steps)]
        position = provider.save_state()["state"]
        iterator.rewind()
        assert [batch_line(next(iterator)) for _ in range(4)] == first
        assert provider.save_state()["state"] == position
        iterator.advance()
        assert batch_line(next(iterator)) not in first
    finally:
        machine.set_mode(mode)


def reference_rank(rank: int, world: int, batches: int) -> list[dict[str, Any]]:
    """The micro-batches an uninterrupted run's DP rank ``rank`` of ``world`` trains."""
    provider = MegatronDataProvider(build_pipeline(), micro_batch_size=MICRO,
                                    global_batch_size=GLOBAL, dp_rank=rank,
                                    dp_world_size=world)  # fmt: skip
    return [batch_line(next(provider)) for _ in range(batches)]


@pytest.mark.timeout(6 * JOB_TIMEOUT_S)
def test_sigkill_then_resume_on_two_one_and_four_ranks_trains_every_sample_once(
    tmp_path: Path,
) -> None:
    killed = tmp_path / "killed"
    run_until_parked_then_kill(torchrun_argv(SCRIPT, killed, "park", STEPS), killed)
    reference = reference_steps(STEPS)
    before = trained(killed, "park", 2)
    assert sorted(before) == list(range(1, PARK_AT + 1))
    assert_each_step(before, reference)
    for world in (2, 1, 4):
        resumed = tmp_path / f"resumed-{world}"
        shutil.copytree(killed / "ckpt", resumed / "ckpt")
        run_job(torchrun_argv(SCRIPT, resumed, "resume", STEPS, PARK_AT, nproc=world), resumed)
        after = trained(resumed, "resume", world)
        assert sorted(after) == list(range(PARK_AT + 1, STEPS + 1)), f"resumed on {world}"
        assert_each_step(after, reference)
    for rank in range(2):  # the same DP size continues bit for bit
        lines = json_lines(killed / f"park-r{rank}.jsonl")
        lines += json_lines(tmp_path / "resumed-2" / f"resume-r{rank}.jsonl")
        expected = reference_rank(rank, 2, len(lines))
        assert [{"rows": x["rows"], "batch": x["batch"]} for x in lines] == expected
    check_refusals(killed / "ckpt", tmp_path)


def check_refusals(saved: Path, tmp_path: Path) -> None:
    """The killed job's rank files: whole ones load; broken ones are refused, naming the file."""
    assert load_generation(saved)[0] == PARK_AT  # the newest complete generation
    missing = tmp_path / "missing"
    shutil.copytree(saved, missing)
    gone = rank_file(missing, PARK_AT, 1)
    gone.unlink()
    with pytest.raises(CheckpointError, match=f"{gone}.* is missing .1 of 2 rank files"):
        load_generation(missing, PARK_AT)
    assert load_generation(missing)[0] == PARK_AT - 1  # no iteration asked: the newest whole one
    damaged = tmp_path / "damaged"
    shutil.copytree(saved, damaged)
    path = rank_file(damaged, PARK_AT, 0)
    content = torch.load(path, weights_only=True)
    content["dataloader_state_dict"]["state"]["lanes"]["0"]["delivered"] = 0
    torch.save(content, path)
    with pytest.raises(CheckpointError, match=f"{path}: checkpoint content does not match"):
        load_generation(damaged, PARK_AT)
    mixed = tmp_path / "mixed"
    shutil.copytree(saved, mixed)
    shutil.copy(rank_file(mixed, PARK_AT - 1, 1), rank_file(mixed, PARK_AT, 1))
    with pytest.raises(CheckpointError, match="different positions"):
        load_generation(mixed, PARK_AT)
    with pytest.raises(CheckpointError, match="no complete generation"):
        load_generation(tmp_path / "nowhere")


def one_rank_save(save_dir: Path, iteration: int, *ranks: int) -> MegatronDataProvider:
    """A 1-rank provider after one iteration, its state written as the files of ``ranks``."""
    provider = MegatronDataProvider(build_pipeline(), micro_batch_size=MICRO,
                                    global_batch_size=GLOBAL)  # fmt: skip
    for _ in range(provider.accumulation_steps):
        next(provider)
    state = provider.save_state()
    for rank in ranks:
        rank_file(save_dir, iteration, rank).parent.mkdir(parents=True, exist_ok=True)
        torch.save({"dataloader_state_dict": state}, rank_file(save_dir, iteration, rank))
    return provider


def test_rank_files_of_more_ranks_than_the_job_or_of_another_provider_are_refused(
    tmp_path: Path,
) -> None:
    one_rank_save(tmp_path / "extra", 3, 0, 1)
    extra = rank_file(tmp_path / "extra", 3, 1)
    with pytest.raises(CheckpointError, match=f"{extra} is one rank file too many"):
        load_generation(tmp_path / "extra", 3)
    foreign = rank_file(tmp_path / "foreign", 3, 0)
    foreign.parent.mkdir(parents=True)
    torch.save({"dataloader_state_dict": {"consumed": 5}}, foreign)
    with pytest.raises(CheckpointError, match=f"{foreign}: not a zephon Megatron data-loader"):
        load_generation(tmp_path / "foreign")


def test_load_state_continues_after_the_saved_iteration_and_only_before_training(
    tmp_path: Path,
) -> None:
    saved = one_rank_save(tmp_path, 1, 0)
    resumed = MegatronDataProvider(build_pipeline(), micro_batch_size=MICRO,
                                   global_batch_size=GLOBAL)  # fmt: skip
    assert resumed.load_state(tmp_path) == 1
    assert batch_line(next(resumed)) == batch_line(next(saved))
    with pytest.raises(CheckpointError, match="load before training starts"):
        resumed.load_state(tmp_path)
