"""The engine contract (transforms/engines/base.py): one `make` keyed by the settings' kind, failures as classes
(the local engine turns vLLM's refusal of one request into RequestRejected itself), and how the feed reads them."""
from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import Future
from types import SimpleNamespace

import pytest

from tests.support.feed_setup import ENGINE, config, tasks
from tests.support.feeding import extract_all
from tests.support.looping_core import LoopingCore
from transforms.engines import make
from transforms.engines.base import EngineDead, Prepared, RequestFailed, RequestRejected, Sampling
from transforms.engines.openai.engine import OpenAIEngine
from transforms.engines.openai.settings import OpenAISettings
from transforms.engines.simulated import SimulatedEngine, SimulatedSettings
from transforms.engines.vllm_local.engine import VllmLocalEngine
from transforms.engines.vllm_machine.engine import VllmMachineEngine
from transforms.engines.vllm_machine.settings import VllmMachineSettings


def test_make_builds_the_engine_of_the_settings_kind(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """One name per backend: the kind is the --engine value (names of issue 37), and make builds its class."""
    monkeypatch.setattr(os, "environ", dict(os.environ))  # the local engine sets vLLM's variables at construction
    machine = VllmMachineSettings(ENGINE, str(tmp_path / "svc"))
    endpoint = OpenAISettings("http://127.0.0.1:9", "tiny", concurrency=3)
    simulated = SimulatedSettings(slots=5, seconds=0.25)
    assert (ENGINE.kind, machine.kind, endpoint.kind, simulated.kind) == \
        ("vllm_local", "vllm_machine", "openai", "simulated")
    assert type(make(ENGINE)) is VllmLocalEngine
    remote = make(machine)
    assert type(remote) is VllmMachineEngine and remote.settings.vllm is ENGINE
    served = make(endpoint)
    assert type(served) is OpenAIEngine and served.sequences() == 3
    sim = make(simulated)
    assert type(sim) is SimulatedEngine and (sim.sequences(), sim.seconds) == (5, 0.25)
    with pytest.raises(ValueError, match="no engine of kind"):
        make(SimpleNamespace(kind="quantum"))


def test_importing_the_engines_and_the_stage_loads_neither_vllm_nor_the_http_client() -> None:
    code = ("import sys, transforms.engines, transforms.extract.stage, pipelines.run.graph; "
            "print(sorted(m for m in ('vllm', 'httpx', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__)))))
    assert out.stdout.strip().splitlines()[-1] == "[]"


class RefusingCore(LoopingCore):
    """vLLM's surface, refusing a prompt at admission as vLLM does (ValueError: e.g. longer than max_model_len)."""

    def _preprocess_cmpl_one(self, request: dict) -> dict:
        if request["prompt"] == "refused":
            raise self.refusal("the prompt is longer than the maximum model length (injected)")
        return request


def vllm_validation_error() -> type[Exception]:
    from vllm.exceptions import VLLMValidationError  # vLLM 0.32's refusal of a too-long prompt: not a ValueError

    assert not issubclass(VLLMValidationError, ValueError)
    return VLLMValidationError


@pytest.mark.parametrize("refusal", [lambda: ValueError, vllm_validation_error],
                         ids=["ValueError", "VLLMValidationError"])
def test_the_local_engine_turns_a_refusal_at_admission_into_request_rejected(refusal) -> None:
    engine = VllmLocalEngine(ENGINE)
    engine.llm = RefusingCore({2: [7] * 10})  # started: the loop drives the fake core
    engine.llm.refusal = refusal()
    try:
        refused = engine.submit(Prepared({"prompt": "refused"}, 0, 0, 0), Sampling(0.0, 1.0, max_tokens=4))
        fine = engine.submit(Prepared({"prompt": "ok"}, 0, 0, 0), Sampling(0.0, 1.0, max_tokens=4))
        with pytest.raises(RequestRejected, match="longer than the maximum model length"):
            refused.result(timeout=60)
        answer = fine.result(timeout=60).output
    finally:
        engine._stopped.set()
    assert (answer.finish_reason, answer.output_tokens, answer.text_tokens) == ("length", 4, 2)
    assert engine.starts == 0  # nothing was restarted for it


class Failing(SimulatedEngine):
    """The first request of each page fails with `error` (once per engine start for an unknown failure)."""

    def __init__(self, error: Exception, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.error = error
        self.failed = 0

    def submit(self, prepared, sampling):
        if (self.starts == 1 and self.failed < 1) or isinstance(self.error, RequestFailed):
            self.failed += 1
            future: Future = Future()
            future.set_exception(self.error)
            return future
        return super().submit(prepared, sampling)


def test_an_unknown_failure_is_taken_for_a_dead_engine() -> None:
    engine = Failing(RuntimeError("something unexpected (injected)"), seconds=0.0)
    (r,) = extract_all(engine, tasks(1, config()), config())
    assert (r.status, r.attempts) == ("ok", 1)  # resubmitted after the restart; the lost request is no attempt
    assert engine.starts == 2


def test_a_request_failure_ends_the_page_with_its_reason_and_restarts_nothing() -> None:
    engine = Failing(RequestFailed("rate_limited", "HTTP 429 after 5 tries (injected)"), seconds=0.0)
    (r,) = extract_all(engine, tasks(1, config(max_attempts=3)), config(max_attempts=3))
    assert (r.status, r.reason_code, r.attempts) == ("failed", "rate_limited", 1)
    assert "429" in (r.message or "") and engine.starts == 1 and engine.failed == 1


def test_an_engine_that_cannot_prepare_fails_the_page_as_a_row() -> None:
    class Dead(SimulatedEngine):
        def prepare(self, request):
            raise EngineDead("no GPU (injected)")

    (r,) = extract_all(Dead(), tasks(1, config()), config())
    assert (r.status, r.reason_code, r.attempts) == ("failed", "engine_error", 0)
    assert r.message == "engine could not start: no GPU (injected)"
