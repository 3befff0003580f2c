"""Mixtures in tokens: calibration, the ratio reached over 1M tokens, what a checkpoint keeps."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from tests._corpus import WORDS
from zephon import Dataset, MixtureSpec, Pipeline, StaticMixtureWorkSource, TokenCalibration
from zephon.errors import CheckpointError, ConfigError

TARGET = {"prose": 0.7, "code": 0.3}


def prose_rows(n: int, seed: int) -> list[dict[str, str]]:
    rng = random.Random(seed)
    return [
        {"text": " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 80)))} for _ in range(n)
    ]


def code_rows(n: int, seed: int) -> list[dict[str, str]]:
    rng = random.Random(seed)
    alphabet = "xyzq_0123456789(){}[]=+-*/;:"
    return [
        {"text": "".join(rng.choice(alphabet) for _ in range(rng.randint(10, 120)))}
        for _ in range(n)
    ]


@pytest.fixture(scope="module")
def corpora() -> list[Dataset]:
    return [
        Dataset.from_records("prose", prose_rows(3000, 1), shard_size=700),
        Dataset.from_records("code", code_rows(3000, 2), shard_size=700),
    ]


def token_lengths(tok_dir: Path, dataset: Dataset) -> list[np.ndarray]:
    tok = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    out = []
    for shard in range(dataset.shard_count()):
        rows = dataset.read(shard, range(dataset.counts()[shard]))
        enc = tok.encode_batch([r["text"] for r in rows], add_special_tokens=False)
        out.append(np.array([len(e.ids) for e in enc]))
    return out


def token_shares(source: StaticMixtureWorkSource, lengths: list[list[np.ndarray]], budget: int):
    totals = np.zeros(2)
    while totals.sum() < budget:
        chunk = source.next_chunk()
        assert chunk is not None
        p = chunk.pointers
        for d in (0, 1):
            rows = p[p[:, 0] == d]
            totals[d] += sum(int(lengths[d][s][i]) for s, i in rows[:, 1:].tolist())
    return totals / totals.sum(), int(totals.sum())


def bytes_per_token(tok_dir: Path, dataset: Dataset) -> float:
    rows = [
        r for s in range(dataset.shard_count()) for r in dataset.read(s, range(dataset.counts()[s]))
    ]
    n_bytes = sum(len(r["text"].encode()) for r in rows)
    return n_bytes / float(np.concatenate(token_lengths(tok_dir, dataset)).sum())


def delivered_shares(pipe: Pipeline, budget: int) -> tuple[list[float], list[float]]:
    """Token shares of the records a pipeline delivers until ``budget`` tokens, and their
    relative errors against TARGET."""
    totals = np.zeros(2)
    for record in pipe:
        totals[record.meta.component_id] += len(record.payload["input_ids"])
        if totals.sum() >= budget:
            break
    shares = totals / totals.sum()
    errors = [abs(shares[0] - 0.7) / 0.7, abs(shares[1] - 0.3) / 0.3]
    return shares.round(4).tolist(), [float(e) for e in errors]


def test_pinned_token_mixture_within_one_percent_over_1m_tokens(corpora, hf_tokenizer_dir):
    lengths = [token_lengths(hf_tokenizer_dir, d) for d in corpora]
    assert bytes_per_token(hf_tokenizer_dir, corpora[0]) > 2 * bytes_per_token(
        hf_tokenizer_dir, corpora[1]
    )  # the datasets differ in tokens per byte
    means = {d.name: float(np.concatenate(x).mean()) for d, x in zip(corpora, lengths)}
    spec = MixtureSpec(TARGET, unit="tokens", tokens_per_sample=means)
    src = StaticMixtureWorkSource(corpora, spec, chunk_size=256, exhausted_policy="repeat")
    shares, total = token_shares(src, lengths, 1_000_000)
    errors = [abs(shares[0] - 0.7) / 0.7, abs(shares[1] - 0.3) / 0.3]
    print(f"pinned: token shares {shares.round(4).tolist()} over {total} tokens, errors {errors}")
    assert max(errors) < 0.01
    by_samples = StaticMixtureWorkSource(corpora, TARGET, chunk_size=256, exhausted_policy="repeat")
    naive, _ = token_shares(by_samples, lengths, 300_000)
    assert abs(naive[0] - 0.7) / 0.7 > 0.05  # weighting by samples misses the token target


@pytest.mark.timeout(120)
def test_calibrated_mixture_with_ensure_mixture_within_one_percent(corpora, hf_tokenizer_dir):
    calibration = TokenCalibration(hf_tokenizer_dir, samples=512)
    spec = MixtureSpec(TARGET, unit="tokens", calibration=calibration)
    source = StaticMixtureWorkSource(corpora, spec, chunk_size=256, exhausted_policy="repeat")
    estimates = source.state_dict()["config"]["tokens_per_sample"]
    assert estimates == calibration.calibrate(corpora)  # a deterministic sample
    pipe = Pipeline(source).tokenize(hf_tokenizer_dir, special_tokens="none", parallelism=2)
    with pytest.raises(ConfigError, match="weight_by='tokens'"):
        pipe.ensure_mixture()
    pipe = pipe.ensure_mixture(weight_by="tokens", max_buffer_size=None)
    pipe = pipe.options(canonical_replicas=2, flush_every_k_chunks=16)
    shares, errors = delivered_shares(pipe, 1_000_000)
    print(f"calibrated + strict ensure_mixture: shares {shares}, errors {errors}")
    assert max(errors) < 0.01


def test_calibration_is_part_of_the_checkpoint(corpora, hf_tokenizer_dir):
    spec = MixtureSpec(TARGET, unit="tokens", calibration=TokenCalibration(hf_tokenizer_dir))
    src = StaticMixtureWorkSource(corpora, spec, chunk_size=64, exhausted_policy="repeat")
    for _ in range(5):
        src.next_chunk()
    state = src.state_dict()
    saved = state["config"]["tokens_per_sample"]
    other = {k: v * 1.1 for k, v in saved.items()}
    moved = StaticMixtureWorkSource(
        corpora, MixtureSpec(TARGET, unit="tokens", tokens_per_sample=other), chunk_size=64,
        exhausted_policy="repeat",
    )  # fmt: skip
    with pytest.raises(CheckpointError, match="tokens_per_sample: saved"):
        moved.load_state_dict(state)
    pinned = StaticMixtureWorkSource(
        corpora, MixtureSpec(TARGET, unit="tokens", tokens_per_sample=saved), chunk_size=64,
        exhausted_policy="repeat",
    )  # fmt: skip
    pinned.load_state_dict(state)
    for _ in range(3):
        a, b = src.next_chunk(), pinned.next_chunk()
        assert a is not None and b is not None
        assert np.array_equal(a.pointers, b.pointers)


@pytest.mark.timeout(120)
def test_mixture_measured_by_the_pipelines_tokenize_within_one_percent(corpora, hf_tokenizer_dir):
    spec = MixtureSpec(TARGET, unit="tokens")
    source = StaticMixtureWorkSource(corpora, spec, chunk_size=256, exhausted_policy="repeat")
    pipe = Pipeline(source).tokenize(hf_tokenizer_dir, parallelism=2)  # bos_eos: +2 per sample
    estimates = source.state_dict()["config"]["tokens_per_sample"]
    bare = TokenCalibration(hf_tokenizer_dir, samples=4096).calibrate(corpora)
    assert estimates == pytest.approx({k: v + 2 for k, v in bare.items()}, rel=1e-12)
    shares, errors = delivered_shares(pipe.options(canonical_replicas=2), 300_000)
    print(f"measured by tokenize, no ensure_mixture: shares {shares}, errors {errors}")
    assert max(errors) < 0.01
    # the estimates are in the fingerprint: a tokenizer that counts otherwise refuses the state
    other = StaticMixtureWorkSource(corpora, spec, chunk_size=256, exhausted_policy="repeat")
    Pipeline(other).tokenize("bytes")
    with pytest.raises(CheckpointError, match="tokens_per_sample: saved"):
        other.load_state_dict(source.state_dict())
    pinned = MixtureSpec(TARGET, unit="tokens", tokens_per_sample=estimates)
    again = StaticMixtureWorkSource(corpora, pinned, chunk_size=256, exhausted_policy="repeat")
    assert again.fingerprint == source.fingerprint  # pinning the saved estimates resumes


def test_token_mixture_needs_estimates(corpora):
    unmeasured = StaticMixtureWorkSource(corpora, MixtureSpec(TARGET, unit="tokens"))
    with pytest.raises(ConfigError, match=r"add \.tokenize\(\.\.\.\) to the pipeline"):
        next(iter(Pipeline(unmeasured).decode_text()))
    with pytest.raises(ConfigError, match="missing: \\['code'\\]"):
        StaticMixtureWorkSource(
            corpora, MixtureSpec(TARGET, unit="tokens", tokens_per_sample={"prose": 3.0})
        )
    with pytest.raises(ConfigError, match="unit must be"):
        MixtureSpec(TARGET, unit="bytes")  # type: ignore[arg-type]
