"""parallelism="auto": worker counts split from the usable cores at compile, with a reason."""

from __future__ import annotations

from typing import Any

import pytest

from tests.engine._sources import RangeSource
from zephon import Dataset, Pipeline
from zephon._engine.plan.auto import checked_width, split
from zephon.errors import ConfigError
from zephon.ops import BaseOp, OpTraits
from zephon.types import StreamItem


def pipe(rows: int = 1) -> Pipeline:
    records = [{"text": f"row {i}"} for i in range(rows)]
    return Pipeline(RangeSource([Dataset.from_records("d", records)], chunk_size=4))


def identity(payload: dict[str, Any]) -> dict[str, Any]:
    return payload


def stages(p: Pipeline) -> dict[str, tuple[int, str]]:
    return {s.op_name: (s.parallelism, s.auto) for s in p.explain().stages}


@pytest.mark.parametrize(
    ("cores", "stages", "shares"),
    [(4, 1, [4]), (4, 2, [2, 2]), (5, 2, [3, 2]), (2, 3, [1, 1, 1]), (7, 3, [3, 2, 2])],
)
def test_split_is_even_with_at_least_one_each(cores: int, stages: int, shares: list[int]) -> None:
    assert split(cores, stages) == shares


@pytest.mark.parametrize("bad", [0, -2, "many", 1.5, True])
def test_a_width_is_a_count_or_auto(bad: Any) -> None:
    with pytest.raises(
        ConfigError, match=rf"^tokenize: parallelism must be .* 'auto', got {bad!r}"
    ):
        checked_width("tokenize", bad, 1)
    with pytest.raises(ConfigError, match=r"parallelism must be a worker count >= 1 or 'auto'"):
        pipe().decode_text(parallelism=bad)


def test_cpu_heavy_built_ins_default_to_auto(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZEPHON_CPUS", "3")
    p = pipe().decode_text().tokenize("bytes").options(runner="threads")
    got = stages(p)
    assert got["decode_text"] == (1, "")  # cheap: one worker unless asked
    assert got["tokenize"] == (3, "auto: 3 of 3 usable cores (ZEPHON_CPUS)")
    assert "   tokenize: auto: 3 of 3 usable cores (ZEPHON_CPUS)" in str(p.explain())
    assert stages(pipe().tokenize("bytes", parallelism=2))["tokenize"] == (2, "")


def test_auto_stages_share_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZEPHON_CPUS", "5")
    p = (
        pipe()
        .map_transform(identity, parallelism="auto", name="a")
        .map_transform(identity, parallelism="auto", name="b")
        .options(runner="threads", fuse=False)
    )
    got = stages(p)
    assert got["a"] == (3, "auto: 3 of 5 usable cores (ZEPHON_CPUS), shared with b")
    assert got["b"] == (2, "auto: 2 of 5 usable cores (ZEPHON_CPUS), shared with a")


def test_fused_auto_stages_take_one_share(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZEPHON_CPUS", "4")
    p = (
        pipe()
        .map_transform(identity, parallelism="auto", name="a")
        .map_transform(identity, parallelism="auto", name="b")
        .options(runner="threads")
    )
    plan = p.explain()
    assert any({1, 2} <= set(group) for group in plan.fused)
    assert stages(p)["a"] == stages(p)["b"] == (4, "auto: 4 of 4 usable cores (ZEPHON_CPUS)")


def test_inline_runs_one_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZEPHON_CPUS", "8")
    got = stages(pipe().tokenize("bytes").options(runner="inline"))
    assert got["tokenize"] == (1, "auto: inline runs one copy; 8 usable cores (ZEPHON_CPUS)")


class HeavyOp(BaseOp):
    """A user operator that marks itself CPU-heavy through its traits."""

    name = "heavy"

    def traits(self) -> OpTraits:
        return OpTraits(preserves_cursor_order=True, parallelism="auto", elementwise=True)

    def process_many(self, elems: list[StreamItem]) -> list[StreamItem]:
        return elems


def test_user_ops_opt_in_through_their_traits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZEPHON_CPUS", "2")
    p = pipe().add_op(HeavyOp()).options(runner="threads")
    assert stages(p)["heavy"] == (2, "auto: 2 of 2 usable cores (ZEPHON_CPUS)")
    assert stages(pipe().add_op(HeavyOp(), parallelism=1))["heavy"] == (1, "")


def test_fetch_takes_auto_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZEPHON_CPUS", "2")
    p = pipe().fetch(parallelism="auto").options(runner="threads")
    assert stages(p)["fetch"] == (2, "auto: 2 of 2 usable cores (ZEPHON_CPUS)")


def test_a_bad_override_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZEPHON_CPUS", "lots")
    with pytest.raises(ConfigError, match=r"ZEPHON_CPUS='lots': set it to a whole number"):
        pipe().tokenize("bytes").explain()


def test_stats_show_the_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZEPHON_CPUS", "2")
    p = pipe(20).decode_text().tokenize("bytes").options(runner="threads")
    assert len(list(p)) == 20
    stats = p.stats()
    assert stats is not None
    tok = next(o for o in stats.operators if o.name == "tokenize")
    assert (tok.parallelism, tok.auto) == (2, "auto: 2 of 2 usable cores (ZEPHON_CPUS)")
    assert tok.to_dict()["auto"] == tok.auto


def test_a_checkpoint_restores_under_another_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    """Widths never shape the output, so a run restores on a machine with other cores."""
    monkeypatch.setenv("ZEPHON_CPUS", "1")
    whole = [r.payload["input_ids"].tobytes() for r in pipe(40).tokenize("bytes")]
    first = pipe(40).tokenize("bytes").options(runner="threads")
    it = iter(first)
    head = [next(it).payload["input_ids"].tobytes() for _ in range(13)]
    ckpt = first.checkpoint()
    it.close()
    monkeypatch.setenv("ZEPHON_CPUS", "3")
    second = pipe(40).tokenize("bytes").options(runner="threads")
    second.restore(ckpt)
    assert stages(second)["tokenize"][0] == 3
    assert head + [r.payload["input_ids"].tobytes() for r in second] == whole


def test_process_stages_split_the_cores_shared_pool_or_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ZEPHON_CPUS", "4")
    p = (
        pipe()
        .map_transform(identity, parallelism="auto", name="a")
        .map_transform(identity, parallelism="auto", name="b")
        .options(runner="process", fuse=False)
    )
    why = "auto: 2 of 4 usable cores (ZEPHON_CPUS), shared with b"
    assert stages(p)["a"] == (2, why)  # in-flight caps on one worker set of 4, moved later
    got = stages(p.options(process_pool="per_op"))
    kept = "kept while running (process_pool='per_op': each stage has its own workers)"
    assert got["a"] == (2, f"{why}; {kept}")
