"""`--devices` as a run sees it: the job-file key, the option checks, the engine it picks, the key it keeps."""
from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.config.engine import engine_kind, engine_settings
from pipelines.config.options import PagemillOptions, job_flags
from pipelines.run.option_checks import check_options
from pipelines.run.settings import run_settings
from transforms.engines.devices.plan import usable_cores, visible_gpus


def options(tmp_path: Path, *flags: str) -> PagemillOptions:
    return PagemillOptions(["--input", str(tmp_path), "--output", str(tmp_path / "out"), "--schema", "invoice",
                            "--model", str(tmp_path), *flags]).view_as(PagemillOptions)


def test_a_job_file_takes_the_same_key() -> None:
    assert job_flags({"devices": 2}) == ["--devices=2"] and job_flags({"devices": "0,1"}) == ["--devices=0,1"]


def test_a_devices_value_that_is_none_or_asks_for_more_than_the_machine_has_is_one_line(tmp_path: Path) -> None:
    bad = check_options(options(tmp_path, "--devices", "two"))
    assert [p for p in bad if "--devices" in p] == ["--devices 'two': expected `all`, a count (1, 2, ...) or a "
                                                    "list of device ids (0,1,3)"]
    too_many = str(max(len(visible_gpus()), len(usable_cores())) + 1)
    found = [p for p in check_options(options(tmp_path, "--devices", too_many)) if "--devices" in p]
    assert len(found) == 1 and found[0].startswith(f"--devices {too_many}:")
    assert not [p for p in check_options(options(tmp_path)) if "--devices" in p]  # `all` always plans


def test_several_engines_on_this_machine_pick_the_machines_engine_service_and_keep_the_key(tmp_path: Path) -> None:
    if len(visible_gpus()) < 2 and len(usable_cores()) < 2:
        pytest.skip("one core, no GPUs: `--devices 2` cannot be planned here (the check above says so)")
    o = options(tmp_path, "--devices", "2", "--workers", "1", "--run_id", "r")
    assert engine_kind(o) == "vllm_machine"  # one worker process, yet two engines: they need the service
    engine = engine_settings(o)
    assert engine.devices == "2" and engine.vllm.run_key == "r"
    assert run_settings(o).extract.config_key == run_settings(options(tmp_path)).extract.config_key
