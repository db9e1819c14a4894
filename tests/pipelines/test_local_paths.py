"""A local --input/--output/model folder with a runner whose workers may run on other machines is a pre-flight
error (exit 2) naming the flag, unless --shared-filesystem says every worker sees the path
(pipelines/run/option_checks.py). The multi-host run itself: tests/pipelines/test_multihost.py."""
from __future__ import annotations

from pathlib import Path

import pytest

from pipelines import cli
from pipelines.config.options import PagemillOptions, merge_flags
from pipelines.run.option_checks import local_path_problems, shared, workers_elsewhere

PORTABLE = ["--runner", "PortableRunner", "--job_endpoint", "embed"]
DATAFLOW = ["--runner", "DataflowRunner", "--project", "p", "--region", "r", "--temp_location", "gs://b/tmp"]


@pytest.mark.parametrize("runner, environment, elsewhere", [
    (None, None, False),  # the DirectRunner: this process or its children
    ("DirectRunner", None, False),
    ("PrismRunner", None, False),  # Prism runs LOOPBACK workers by default
    ("DataflowRunner", None, True),
    ("DataflowRunner", "LOOPBACK", True),  # Dataflow's workers are VMs whatever the flag says
    ("PortableRunner", None, True),  # Beam's default environment of a portable runner is DOCKER
    ("PortableRunner", "EXTERNAL", True),
    ("FlinkRunner", "DOCKER", True),
    ("SparkRunner", "beam:env:external:v1", True),
    ("DirectRunner", "DOCKER", True),  # a container sees its own files, even on this machine
    ("FlinkRunner", "LOOPBACK", False),  # the SDK workers are the launcher's process
    ("SparkRunner", "PROCESS", True),  # processes on Spark's workers
    ("PortableRunner", "PROCESS", False),  # started by the embedded job service, on this machine
    ("DirectRunner", "PROCESS", False),
    ("apache_beam.runners.portability.flink_runner.FlinkRunner", "EXTERNAL", True),
])
def test_which_runners_run_workers_elsewhere(runner: str | None, environment: str | None, elsewhere: bool) -> None:
    assert (workers_elsewhere(runner, environment) is not None) is elsewhere
    assert (workers_elsewhere(runner, environment, "embed") is not None) is elsewhere


def test_process_workers_of_a_remote_job_service_are_elsewhere() -> None:
    assert workers_elsewhere("PortableRunner", "PROCESS", "jobserver.example:8099") is not None


def test_shared_folders_are_whole_path_components(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert shared("/data/in", ["/data"]) and shared("/data", ["/data/"]) and shared("/anything", ["/"])
    assert not shared("/data2/in", ["/data"])  # a prefix of the name is not the folder
    assert not shared("/data/../etc", ["/data"])
    monkeypatch.chdir(tmp_path)
    assert shared("in", [str(tmp_path)]) and not shared("in", [str(tmp_path / "other")])


def options(*flags: str) -> PagemillOptions:
    return PagemillOptions(merge_flags(list(flags), None)).view_as(PagemillOptions)


def test_each_local_path_is_named_until_it_is_shared(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    given = ["--input", str(tmp_path / "in"), "--input", "s3://b/in/", "--input", f"@{tmp_path}/list.txt",
             "--output", str(tmp_path / "out"), "--model", str(model), *PORTABLE, "--environment_type", "EXTERNAL"]
    problems = local_path_problems(options(*given))
    flagged = [p.split(":")[0] for p in problems]
    assert flagged == [f"--input {tmp_path / 'in'}", f"--input {tmp_path}/list.txt", f"--output {tmp_path / 'out'}",
                       f"--model {model}"]
    assert all("--environment_type EXTERNAL" in p and "--shared-filesystem" in p for p in problems)
    # The model folder as a mounted volume, the output on NFS: only the inputs are left.
    partly = local_path_problems(options(*given, "--shared-filesystem", str(model),
                                         "--shared-filesystem", str(tmp_path / "out")))
    assert [p.split(":")[0] for p in partly] == flagged[:2]
    # Alone, the flag shares every local path; a following flag is not taken for its value.
    everything = options(*given[:-2], "--shared-filesystem", "--environment_type", "EXTERNAL")
    assert everything.shared_filesystem == ["/"] and local_path_problems(everything) == []


def test_object_stores_served_models_and_local_runners_pass(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    assert local_path_problems(options("--input", "s3://b/in/", "--output", "gs://b/out", "--model", str(model),
                                       "--engine", "openai", *DATAFLOW)) == []
    assert local_path_problems(options("--input", "s3://b/in/", "--output", "s3://b/out", "--model", str(model),
                                       "--extract", "false", *DATAFLOW)) == []
    assert local_path_problems(options("--input", str(tmp_path), "--output", str(tmp_path / "out"),
                                       "--model", str(model), *PORTABLE, "--environment_type", "LOOPBACK")) == []


def test_a_job_file_lists_shared_folders(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(f"input: [{tmp_path}/in]\noutput: {tmp_path}/out\nshared_filesystem: [{tmp_path}]\n")
    o = PagemillOptions(merge_flags(DATAFLOW, str(job))).view_as(PagemillOptions)
    assert o.shared_filesystem == [str(tmp_path)] and local_path_problems(o) == []


def test_pagemill_run_exits_2_naming_the_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "in").mkdir()
    code = cli.main(["run", "--input", str(tmp_path / "in"), "--output", "s3://b/out", "--extract", "false",
                     "--progress-every-s", "0", *DATAFLOW])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"pagemill run: --input {tmp_path / 'in'}: a local path, and --runner DataflowRunner" in err
    assert "Traceback" not in err and not (tmp_path / "out").exists()
