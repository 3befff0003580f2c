"""A source's mixture checked against its datasets and resolved into phases.

A token mixture needs tokens per sample; when nothing gave them, the phases stay provisional
(every sample weighs one token) until :meth:`PhasedMixture.measured` counts them through the
pipeline.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from zephon.errors import ConfigError, DataError
from zephon.work._calibration import TokenCalibration
from zephon.work._mixture import MixtureSpec
from zephon.work._schedule import MixtureSchedule, needs_measuring, resolve, token_estimates

if TYPE_CHECKING:
    from zephon.io import Dataset

#: Rows per dataset a token mixture is measured on when nothing else is given: the share error
#: is about the relative standard error of each mean (length CV / sqrt(rows)), so larger than
#: TokenCalibration's default; datasets up to this size are measured exactly.
MEASURE_SAMPLES = 4096


class PhasedMixture:
    """``mixture`` (``None``: weights by dataset size) over ``datasets``, as phases."""

    def __init__(
        self,
        mixture: MixtureSpec | MixtureSchedule | Mapping[str, float] | None,
        datasets: Sequence[Dataset],
    ) -> None:
        names = [d.name for d in datasets]
        if mixture is None:
            mixture = MixtureSpec({d.name: float(d.total()) for d in datasets})
        elif not isinstance(mixture, MixtureSpec | MixtureSchedule):
            mixture = MixtureSpec(mixture)
        unknown = [k for k in mixture.names() if k not in names]
        if unknown:
            raise ConfigError(
                f"mixture names unknown dataset(s) {unknown}; the source's datasets are {names}"
            )
        missing = [n for n in names if n not in mixture.names()]
        if missing:
            raise ConfigError(
                f"dataset(s) {missing} have no weight in the mixture; add them to the "
                "MixtureSpec or remove them from the source"
            )
        self.names = names
        self.schedule = mixture if isinstance(mixture, MixtureSchedule) else None
        self.first = mixture.first() if isinstance(mixture, MixtureSchedule) else mixture
        self.full = mixture
        self.unmeasured = needs_measuring(mixture)
        self.estimates = token_estimates(mixture, datasets)
        # until measure runs, phases as if every sample weighed one token
        provisional = dict.fromkeys(names, 1.0) if self.unmeasured else self.estimates
        self.phases = resolve(mixture, names, provisional)

    def measured(
        self, datasets: Sequence[Dataset], count: Callable[[list[Any]], list[int]]
    ) -> PhasedMixture:
        """This mixture with token estimates measured by ``count`` (rows -> the tokens each
        becomes in the pipeline) on :data:`MEASURE_SAMPLES` rows per dataset, picked as
        :class:`TokenCalibration` picks them, and phases resolved with them (a copy: clones
        of a source share their mixture)."""
        try:
            sample = TokenCalibration(samples=MEASURE_SAMPLES)
            estimates = sample.calibrate(datasets, count)
        except DataError as exc:
            raise ConfigError(
                f"token mixture: measuring tokens per sample through the pipeline failed on a "
                f"sampled row: {exc}; fix the data or the operators, or pass "
                "tokens_per_sample={...} or calibration=TokenCalibration(...) to the MixtureSpec"
            ) from None
        out = copy.copy(self)
        out.estimates = estimates
        out.unmeasured = False
        out.phases = resolve(self.full, self.names, estimates)
        return out

    def require_measured(self) -> None:
        if self.unmeasured:
            raise ConfigError(
                "the mixture is in tokens (unit='tokens') but nothing measured its tokens per "
                "sample: add .tokenize(...) to the pipeline (it measures them; so does "
                ".tokenize_chat), or pass "
                "tokens_per_sample={dataset: mean tokens} or calibration=TokenCalibration(...) "
                "to the MixtureSpec"
            )

    def config(self) -> dict[str, Any]:
        """The mixture's part of the source's configuration summary: first-phase weights,
        token estimates and the schedule's unit (the last two absent for a plain sample
        mixture, so such configurations keep their fingerprint). Schedule points stay out:
        only the checkpointed past of a schedule must match (see ``check_past``)."""
        out: dict[str, Any] = {
            "weights": self.phases[0].weights if self.schedule is None else "scheduled"
        }
        if self.estimates is not None:
            out["unit"] = self.first.unit
            out["tokens_per_sample"] = self.estimates
        if self.schedule is not None:
            out["schedule_by"] = self.schedule.by
        return out
