"""Shared fixtures of the capture tests: the mutation parametrisation."""

from __future__ import annotations

import pytest

from zephon.capture.testing import MUTATIONS, Mutation


@pytest.fixture(params=sorted(MUTATIONS))
def mutation(request: pytest.FixtureRequest) -> Mutation:
    """Parametrised over every mutation; combine with any store factory."""
    result: Mutation = MUTATIONS[request.param]
    return result
