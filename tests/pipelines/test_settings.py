"""run_settings (pipelines/run/settings.py): the stages' settings built once from the options; the cache
configuration key follows every option that reaches a keyed setting, and no option that only paces the run."""
from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from pipelines.config.options import PagemillOptions
from pipelines.run.settings import RunSettings, run_settings
from transforms.engines.base import EngineDead


def settings(*flags: str) -> RunSettings:
    return run_settings(PagemillOptions(["--input", "in/", "--output", "out/", *flags]).view_as(PagemillOptions))


def test_settings_are_frozen_and_a_render_only_run_has_no_extract_settings() -> None:
    s = settings()
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.tenant = "other"  # type: ignore[misc]
    assert (s.inputs, s.output, s.endpoint) == (("in/",), "out/", None)
    assert s.extract is not None and settings("--extract", "false").extract is None
    assert "secret" not in repr(settings("--s3_secret_access_key", "secret"))  # the keys are never printed


@pytest.mark.parametrize("flags", [
    ("--dpi", "200"), ("--max-side", "1000"), ("--jpeg-quality", "80"), ("--max-text-chars", "100"),
    ("--hints", "none"), ("--ocr-lang", "deu"), ("--min-text-coverage", "0.3"), ("--detail", "high"),
    ("--low-detail-side", "500"), ("--injection-policy", "neutralise"), ("--max-hint-chars", "10"),
    ("--nsfw-classifier", "none"), ("--safety-check", "pkg.mod:check"), ("--tenant", "acme"),
    ("--model-revision", "v2"), ("--max-tokens", "100"), ("--max-model-len", "4096"), ("--schema", "receipt"),
])
def test_options_that_change_an_answer_change_the_key(flags: tuple[str, ...]) -> None:
    assert settings(*flags).extract.config_key != settings().extract.config_key


@pytest.mark.parametrize("flags", [
    ("--max-bytes", "1000"), ("--max-attempts", "5"), ("--ocr-timeout-s", "3"), ("--gpu-hourly-usd", "9"),
    ("--document-timeout-s", "0"), ("--flush-rows", "1"), ("--pdq-threshold", "5"), ("--max-num-seqs", "3"),
    ("--gpu-memory-utilization", "0.5"), ("--tensor-parallel-size", "2"), ("--limit-mm-per-prompt", "2"),
    ("--kv-cache-gib", "4"), ("--enforce-eager", "true"), ("--engine-in-process", "false"),
])
def test_options_that_only_pace_or_price_the_run_keep_the_key(flags: tuple[str, ...]) -> None:
    assert settings(*flags).extract.config_key == settings().extract.config_key


def test_two_runs_of_one_job_on_a_machine_engine_share_the_key() -> None:
    """The machine engine's folder holds the run id: the key must not, or no run would reuse another's rows."""
    first, second = (settings("--engine-service", "machine", "--run_id", run) for run in ("run-1", "run-2"))
    assert first.engine.service_dir != second.engine.service_dir
    assert first.extract.config_key == second.extract.config_key


def test_a_squatted_engine_base_gives_the_run_a_private_folder_its_workers_and_service_use(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Another local user made `<tmp>/pagemill-<uid>` first. Fails before the fix: the worker refused the folder
    (EngineDead, FolderRefused) and every page of every machine-engine run failed. Now the launcher's settings
    name a fresh private folder, the worker and the service (the real service loop, a stub engine, in threads)
    accept it, and a page is answered; a folder the user named under the squatted base stays refused."""
    from PIL import Image

    from tests.transforms.engines.machine_stubs import SAMPLING, StubRemoteEngine, ThreadRemoteEngine, answer
    from tests.transforms.engines.test_machine_folder import squat
    from tests.transforms.extract.feeding import vllm_request

    temp = Path(tempfile.mkdtemp(prefix="pm-"))  # short: the socket's path has a length limit
    monkeypatch.setattr(tempfile, "tempdir", str(temp))  # never the machine's own temp folder
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    squatted = temp / f"pagemill-{os.getuid()}"
    why = squat(squatted)
    try:
        engine = settings("--engine-service", "machine", "--run_id", "squat").engine
        assert engine.service_dir is not None and Path(engine.service_dir).parent.parent == temp
        worker = ThreadRemoteEngine(engine)  # the service in threads: its own folder check, socket and loop
        try:
            page = vllm_request("page", Image.new("RGB", (4, 4)))
            assert answer(worker.submit(page, SAMPLING))["prompt"] == "page"
        finally:
            worker.close()
        named = settings("--engine-service", "machine", "--engine-service-dir", str(squatted / "mine")).engine
        assert named.service_dir == str(squatted / "mine")  # the user's choice: refused, never replaced
        with pytest.raises(EngineDead, match=why):
            StubRemoteEngine(named).start()
    finally:
        shutil.rmtree(temp, ignore_errors=True)
