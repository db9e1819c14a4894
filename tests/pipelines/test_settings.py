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
    assert (s.inputs, s.output) == (("in/",), "out/")
    assert not any(f.name == "endpoint" for f in dataclasses.fields(RunSettings))  # one engine slot
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

    from tests.support.feeding import vllm_request
    from tests.support.folder_attacks import squat
    from tests.support.machine_stubs import SAMPLING, StubRemoteEngine, ThreadRemoteEngine, answer

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


@pytest.mark.parametrize(("flags", "kind", "cls"), [
    (("--engine", "vllm_local"), "vllm_local", "VllmLocalSettings"),
    (("--engine", "vllm_machine"), "vllm_machine", "VllmMachineSettings"),
    (("--engine", "openai", "--endpoint", "http://h:8000/v1"), "openai", "OpenAISettings"),
    (("--engine", "simulated"), "simulated", "SimulatedSettings"),
    ((), "vllm_local", "VllmLocalSettings"),  # the `vllm` alias, one worker in process
    (("--engine", "vllm", "--engine-service", "machine"), "vllm_machine", "VllmMachineSettings"),
    (("--engine-service", "process", "--direct_running_mode", "multi_processing", "--direct_num_workers", "2"),
     "vllm_local", "VllmLocalSettings"),
    (("--direct_running_mode", "multi_processing", "--direct_num_workers", "2"), "vllm_machine",
     "VllmMachineSettings"),
])
def test_the_engine_slot_holds_the_chosen_kinds_settings(flags: tuple[str, ...], kind: str, cls: str) -> None:
    """One slot: the kind's own settings value, the aliases (`vllm`, --engine-service) resolved by the old rule."""
    engine = settings("--run_id", "r1", *flags).engine
    assert (engine.kind, type(engine).__name__) == (kind, cls)


def test_every_engine_kind_keeps_the_key_of_the_model_it_runs() -> None:
    """The key names the model's settings, not the backend: a page extracted in process is reused by a machine
    engine's run, and the key is the one runs before the engine slot wrote (the vLLM settings of the options)."""
    keys = {settings("--run_id", "r1", "--engine", kind, "--endpoint", "http://h:8000/v1").extract.config_key
            for kind in ("vllm_local", "vllm_machine", "openai", "simulated", "vllm")}
    assert len(keys) == 1
    assert settings("--engine", "openai", "--endpoint", "http://h/v1", "--model", "other").extract.config_key \
        not in keys


def test_an_engine_service_alias_that_contradicts_the_engine_is_refused(tmp_path: Path) -> None:
    from pipelines.run.settings import settings_from_options

    o = PagemillOptions(["--input", str(tmp_path), "--output", str(tmp_path / "out"), "--engine", "vllm_local",
                         "--engine-service", "machine"]).view_as(PagemillOptions)
    assert settings_from_options(o) == [
        "--engine-service machine is an alias of --engine vllm_machine; it contradicts --engine vllm_local"]


def test_the_run_and_the_estimate_load_the_schema_rule_and_blocklists_once_each(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`pagemill run` up to its pipeline (stopped where the waves would start) and `pagemill estimate`: each loads
    the schema, the image-token rule and the blocklists at most once (the run checked them, then loaded them
    again to build, before settings were built in one pass)."""
    from collections import Counter

    from pipelines import cli
    from pipelines.run import waves
    from tests.support import docmaker
    from transforms.model import markdown, token_math
    from transforms.safety import gate

    loads: Counter[str] = Counter()

    def counting(name: str, real: object) -> object:
        def wrapper(*args: object, **kwargs: object) -> object:
            loads[name] += 1
            return real(*args, **kwargs)  # type: ignore[operator]
        return wrapper

    monkeypatch.setattr(markdown, "load_output", counting("schema", markdown.load_output))
    monkeypatch.setattr(token_math, "rule_for", counting("rule", token_math.rule_for))
    monkeypatch.setattr(gate, "load_blocklists", counting("blocklists", gate.load_blocklists))

    class Stop(Exception):
        pass

    def stop(*args: object, **kwargs: object) -> None:
        raise Stop("the pipeline would start here")

    monkeypatch.setattr(waves, "run_waves", stop)
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.png").write_bytes(docmaker.tiny_png())
    blocklist = tmp_path / "blocked.txt"
    blocklist.write_text("sha256:" + "0" * 64 + "\n")
    flags = ["--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"), "--blocklist", str(blocklist),
             "--nsfw-classifier", "none", "--model", "org/model", "--workers", "1"]
    assert cli.main(["run", *flags]) == 1 and "the pipeline would start here" in capsys.readouterr().err
    assert loads == {"schema": 1, "rule": 1, "blocklists": 1}
    loads.clear()
    assert cli.main(["estimate", *flags, "--sample-pages", "0"]) == 0
    assert loads == {"schema": 1, "rule": 1}  # the estimate reads no blocklist


@pytest.mark.parametrize("flags", [("--engine", "vllm_machine"), ("--engine", "vllm_local"),
                                   ("--engine", "openai", "--endpoint", "http://h:8000/v1")])
def test_the_waves_engine_hold_makes_the_machine_engine_through_make_only(
        flags: tuple[str, ...], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """waves.EngineHold holds the run's machine engine between waves: made by transforms.engines.make from the one
    engine slot (a recording maker here, no service), and nothing for an engine in process or an endpoint."""
    import transforms.engines
    from pipelines.run.waves import EngineHold
    from transforms.engines.vllm_machine.engine import SOCKET

    made: list[object] = []

    class Held:
        def __init__(self, settings: object) -> None:
            made.append(settings)
            self.calls: list[str] = []

        def start(self) -> None:
            self.calls.append("start")

        def shutdown(self) -> None:
            self.calls.append("shutdown")

    monkeypatch.setattr(transforms.engines, "make", Held)
    s = settings("--engine-service-dir", str(tmp_path / "engine"), *flags)
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / SOCKET).touch()  # the service is up
    hold = EngineHold(s)
    if s.engine.kind != "vllm_machine":
        assert hold.folder is None  # __enter__ starts no watcher
        return
    hold._watch()  # the watcher's loop, in this thread: it finds the socket and connects
    hold.__exit__(None, None, None)
    assert made == [s.engine] and hold.engine.calls == ["start", "shutdown"]
