"""A local batch run uses one worker process a core unless told otherwise; Beam's own flags, another
runner or streaming are left alone."""
from __future__ import annotations

import pytest

from pipelines.config.options import PagemillOptions
from pipelines.run.local_workers import local_workers_flags, resolve_local_workers, small_run

MULTI = ["--direct_running_mode=multi_processing"]


AUTO = [*MULTI, "--direct_num_workers=0"]  # one a core, or in process for a small listing: the run decides


@pytest.mark.parametrize("flags,cores,expected", [
    (["--input", "x"], 2, AUTO),
    (["--input", "x"], 16, AUTO),
    (["--input", "x"], 1, []),  # one core: in this process
    (["--workers", "1"], 8, []),
    (["--workers=3"], 2, [*MULTI, "--direct_num_workers=3"]),
    (["--direct_running_mode=in_memory"], 8, []),  # Beam's flags win
    (["--direct_num_workers=4"], 8, []),
    (["--direct_running_mode", "multi_processing"], 8, []),
    (["--runner=PortableRunner"], 8, []),
    (["--runner", "DataflowRunner"], 8, []),
    (["--streaming"], 8, []),
    (["--runner=DirectRunner"], 4, AUTO),
])
def test_local_workers_flags(flags: list[str], cores: int, expected: list[str]) -> None:
    assert local_workers_flags(flags, cores) == expected


@pytest.mark.parametrize("flags,small,expected", [
    ([], False, ("multi_processing", 6)),  # `--workers 0`: one a usable core
    ([], True, ("in_memory", 1)),  # a small listing starts no pool
    (["--workers", "3"], True, ("multi_processing", 3)),  # chosen: left alone
    (["--direct_running_mode=multi_processing", "--direct_num_workers=2"], True, ("multi_processing", 2)),
])
def test_the_run_resolves_auto_workers(flags: list[str], small: bool, expected: tuple[str, int]) -> None:
    from apache_beam.options.pipeline_options import DirectOptions

    flags = ["--input", "x", "--output", "y", *flags]
    options = PagemillOptions(flags + local_workers_flags(flags, 6))
    resolve_local_workers(options, 6, small)
    direct = options.view_as(DirectOptions)
    assert (direct.direct_running_mode, direct.direct_num_workers) == expected
    assert options.get_all_options()["direct_running_mode"] == expected[0]  # what the workers are handed


def test_small_run() -> None:
    assert small_run(6, 100_000) and small_run(32, 2 * 2**20)
    assert not small_run(33, 1000) and not small_run(1, 2 * 2**20 + 1)


@pytest.mark.parametrize("flag", ["--workers", "--render-range-pages"])
def test_negative_counts_are_usage_errors(flag: str, tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    from pipelines import cli

    (tmp_path / "in").mkdir()
    code = cli.main(["run", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"), "--extract", "false",
                     flag, "-1"])
    assert code == 2 and f"{flag} -1 is negative" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
