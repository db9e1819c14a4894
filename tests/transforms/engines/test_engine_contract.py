"""The engine contract's suite (contract_suite.py) on the simulated engine; the vLLM engines run it in
tests/transforms/extract/test_extract.py, the OpenAI engine in tests/pipelines/test_served.py."""
from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.support.contract_suite import CHECKS, Subject
from transforms.engines import make
from transforms.engines.simulated import SimulatedSettings  # the one place this wiring names the engine's settings


def simulated_subject() -> Subject:
    """One slot, so that an aborted request that kept its slot would hold up the next one."""
    engine = make(SimulatedSettings(slots=1, seconds=0.05))
    # The simulated engine's own queue and slots: what it still holds.
    return Subject(engine, "simulated", held=lambda: len(engine._queue) + len(engine._running))  # type: ignore[attr-defined]


@pytest.mark.parametrize("check", CHECKS, ids=[c.__name__ for c in CHECKS])
def test_the_simulated_engine_honours_the_contract(check: Callable[[Subject], None]) -> None:
    check(simulated_subject())
