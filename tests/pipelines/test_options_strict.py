"""Strict options: an unknown flag or job key is a usage error (exit 2) that names it and the nearest known
name; every Beam pipeline option still passes; booleans work bare, negated and as true/false."""
from __future__ import annotations

from pathlib import Path

import pytest

from pipelines import cli
from pipelines.config.options import PagemillOptions, check_flags, merge_flags
from tests.support import docmaker
from tests.support.raw import raw_rows


def _inputs(tmp_path: Path) -> Path:
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "one.pdf").write_bytes(docmaker.multipage_pdf(1))
    return folder


def test_misspelt_flag_exits_2_naming_it_and_writes_nothing(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    code = cli.main(["run", "--input", str(_inputs(tmp_path)), "--output", str(out), "--max-pagez", "5"])
    err = capsys.readouterr().err
    assert code == 2
    assert "--max-pagez" in err and "--max-pages" in err
    assert not out.exists()


@pytest.mark.parametrize("key, nearest", [("max_pagez", "max_pages"), ("since_last_runs", "since_last_run")])
def test_misspelt_job_key_exits_2_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str], key: str,
                                            nearest: str) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(f"input: [{_inputs(tmp_path)}]\noutput: {tmp_path / 'out'}\n{key}: 5\n")
    code = cli.main(["run", "--job", str(job)])
    err = capsys.readouterr().err
    assert code == 2
    assert repr(key) in err and nearest in err
    assert not (tmp_path / "out").exists()


def test_unknown_pipeline_arg_in_a_job_file_is_refused(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("input: [x]\npipeline_args: ['--direct_num_workerz=2']\n")
    with pytest.raises(ValueError, match="direct_num_workers"):
        merge_flags([], str(job))
    job.write_text("input: [x]\npipeline_args: ['--direct_num_workers=2']\nforce: true\nextract: false\n")
    o = PagemillOptions(merge_flags([], str(job))).view_as(PagemillOptions)
    assert (o.force, o.extract) == (True, False)


def test_a_job_value_of_the_wrong_type_is_refused(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("input: [x]\nmax_pages: many\n")
    with pytest.raises(ValueError, match="max_pages"):
        merge_flags([], str(job))


def test_beam_and_runner_flags_are_known() -> None:
    beam_flags = ["--runner=PortableRunner", "--job_endpoint=embed", "--environment_type=EXTERNAL",
                  "--environment_config=localhost:50000", "--direct_running_mode=multi_processing",
                  "--direct_num_workers=2", "--experiments=no_use_multiple_sdk_containers", "--project=p",
                  "--region=r", "--temp_location=gs://b/tmp", "--sdk_container_image=img", "--flink_master=h:8081",
                  "--spark_master_url=spark://h:7077", "--s3_region_name=eu-west-1", "--job_name=nightly",
                  "--dataflow_service_options=worker_accelerator=type:nvidia-l4;count:1;install-nvidia-driver",
                  "--save_main_session"]
    assert check_flags(beam_flags) == []


def test_stray_values_and_bad_types_are_refused() -> None:
    assert check_flags(["stray"]) == ["unexpected argument 'stray'"]
    (problem,) = check_flags(["--max-pages", "abc"])
    assert "--max-pages" in problem and "abc" in problem
    (problem,) = check_flags(["--force", "maybe"])
    assert "maybe" in problem


@pytest.mark.parametrize("flags, expected", [
    (["--force"], (True, True)),
    (["--force", "false"], (False, True)),
    (["--force=true", "--no-extract"], (True, False)),
    (["--extract", "false"], (False, False)),
    (["--no_force", "--extract=yes"], (False, True)),
])
def test_booleans_bare_negated_and_valued(flags: list[str], expected: tuple[bool, bool]) -> None:
    assert check_flags(flags) == []
    o = PagemillOptions(flags).view_as(PagemillOptions)
    assert (o.force, o.extract) == expected


def test_bare_force_runs(tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = ["run", "--input", str(_inputs(tmp_path)), "--output", str(out), "--run-id", "r", "--no-extract",
            "--progress-every-s", "0", "--workers", "1"]
    assert cli.main(args) == 0
    assert cli.main([*args, "--force"]) == 0  # bare: replaces the run rather than failing to parse
    (row,) = raw_rows(out, "documents", "r")
    assert row["outcome"] == "rendered"


def test_estimate_refuses_unknown_flags(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["estimate", "--input", "x", "--max-tokenz", "5"]) == 2
    assert "--max-tokens" in capsys.readouterr().err


def test_run_help_lists_the_options(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--document-timeout-s" in out and "--max-failed-fraction" in out and "--s3-endpoint-url" in out
