"""Token estimates per dataset, for mixtures weighted in tokens.

A source can only count samples; to hit a *token* ratio it needs each dataset's mean tokens per
sample. :class:`TokenCalibration` measures it by tokenizing a deterministic sample of rows: the
rows are picked by a keyed hash of ``(seed, dataset position, j)``, never by an RNG whose
algorithm could change, so the same data, tokenizer and settings always give the same
estimates. The estimates become part of the source configuration, hence of its fingerprint and
of every checkpoint: a resume that would measure differently (other data or tokenizer) is
refused with both values named, and pinning ``tokens_per_sample`` to the saved values resumes.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from zephon.errors import ConfigError, MissingFieldError
from zephon.work._hashing import mix64

if TYPE_CHECKING:
    from zephon.io import Dataset

TAG_CALIBRATION = 5


@dataclass(frozen=True)
class TokenCalibration:
    """Measure tokens per sample on ``samples`` rows of each dataset.

    ``tokenizer``: anything ``tokenize`` accepts (``"bytes"``, a ``tokenizer.json``, a
    transformers directory or instance); the text is ``row[field]``. ``measure``: instead, a
    function ``row -> token count`` (e.g. for conversations rendered by a chat template).
    """

    tokenizer: Any = "bytes"
    field: str = "text"
    samples: int = 1024
    seed: int = 0
    measure: Callable[[Any], int] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.samples, bool) or not isinstance(self.samples, int) or self.samples < 1:
            raise ConfigError(f"TokenCalibration: samples must be >= 1, got {self.samples!r}")

    def describe(self) -> dict[str, Any]:
        tok = self.tokenizer
        return {
            "tokenizer": tok if isinstance(tok, str) else type(tok).__name__,
            "field": self.field,
            "samples": self.samples,
            "seed": self.seed,
            "measure": getattr(self.measure, "__qualname__", None),
        }

    def picks(self, dataset_index: int, total: int) -> list[int]:
        """Sorted distinct global row positions to measure (all rows for a small dataset)."""
        if total <= self.samples:
            return list(range(total))
        chosen: set[int] = set()
        j = 0
        while len(chosen) < self.samples:
            chosen.add(mix64(self.seed, TAG_CALIBRATION, dataset_index, j) % total)
            j += 1
        return sorted(chosen)

    def _rows(self, dataset: Dataset, positions: Sequence[int]) -> list[Any]:
        starts = np.cumsum([0, *dataset.counts()]).tolist()
        by_shard: dict[int, list[int]] = {}
        for p in positions:
            shard = bisect.bisect_right(starts, p) - 1
            by_shard.setdefault(shard, []).append(p - starts[shard])
        rows: list[Any] = []
        for shard, local in sorted(by_shard.items()):
            rows.extend(dataset.read(shard, local))
        return rows

    def _texts(self, dataset: Dataset, rows: list[Any]) -> list[str]:
        texts = []
        for row in rows:
            try:
                value = row[self.field]
            except (KeyError, TypeError):
                raise MissingFieldError(
                    f"TokenCalibration: a row of dataset {dataset.name!r} has no field "
                    f"{self.field!r}; pass field=... or measure=<row -> token count>"
                ) from None
            texts.append(value.decode() if isinstance(value, bytes) else str(value))
        return texts

    def calibrate(
        self,
        datasets: Sequence[Dataset],
        count: Callable[[list[Any]], list[int]] | None = None,
    ) -> dict[str, float]:
        """Mean tokens per sample of each dataset, by name. ``count``: rows -> token counts
        (a pipeline's own operators), instead of ``tokenizer`` or ``measure``."""
        from zephon._tokenizers import load_tokenizer

        encoder = None if count or self.measure else load_tokenizer(self.tokenizer)
        out: dict[str, float] = {}
        for i, dataset in enumerate(datasets):
            rows = self._rows(dataset, self.picks(i, dataset.total()))
            if count is not None:
                counts = count(rows)
            elif self.measure is not None:
                counts = [int(self.measure(row)) for row in rows]
            else:
                assert encoder is not None
                counts = [len(ids) for ids in encoder.encode_many(self._texts(dataset, rows))]
            mean = sum(counts) / len(counts)
            if mean <= 0:
                raise ConfigError(
                    f"TokenCalibration: dataset {dataset.name!r} measured 0 tokens per sample; "
                    "check field= or pin tokens_per_sample"
                )
            out[dataset.name] = mean
        return out


def check_estimates(estimates: Mapping[str, float], names: Sequence[str], where: str) -> None:
    missing = [n for n in names if n not in estimates]
    bad = {k: v for k, v in estimates.items() if not (isinstance(v, int | float) and v > 0)}
    if missing or bad:
        raise ConfigError(
            f"{where}: tokens_per_sample needs a positive number for every dataset "
            f"(missing: {missing}, invalid: {bad})"
        )
