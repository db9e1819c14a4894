"""A local batch run uses one worker process a core unless told otherwise; Beam's own flags, another
runner or streaming are left alone."""
from __future__ import annotations

import pytest

from pipelines.options import PagemillOptions, local_workers_flags

MULTI = ["--direct_running_mode=multi_processing"]


@pytest.mark.parametrize("flags,cores,expected", [
    (["--input", "x"], 2, [*MULTI, "--direct_num_workers=2"]),
    (["--input", "x"], 16, [*MULTI, "--direct_num_workers=16"]),
    (["--input", "x"], 1, []),  # one core: in this process
    (["--workers", "1"], 8, []),
    (["--workers=3"], 2, [*MULTI, "--direct_num_workers=3"]),
    (["--direct_running_mode=in_memory"], 8, []),  # Beam's flags win
    (["--direct_num_workers=4"], 8, []),
    (["--direct_running_mode", "multi_processing"], 8, []),
    (["--runner=PortableRunner"], 8, []),
    (["--runner", "DataflowRunner"], 8, []),
    (["--streaming"], 8, []),
    (["--runner=DirectRunner"], 4, [*MULTI, "--direct_num_workers=4"]),
])
def test_local_workers_flags(flags: list[str], cores: int, expected: list[str]) -> None:
    assert local_workers_flags(flags, cores) == expected


def test_the_flags_reach_beams_direct_options() -> None:
    from apache_beam.options.pipeline_options import DirectOptions

    flags = ["--input", "x", "--output", "y"]
    direct = PagemillOptions(flags + local_workers_flags(flags, 6)).view_as(DirectOptions)
    assert (direct.direct_running_mode, direct.direct_num_workers) == ("multi_processing", 6)


@pytest.mark.parametrize("flag", ["--workers", "--render-range-pages"])
def test_negative_counts_are_usage_errors(flag: str, tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    from pipelines import cli

    (tmp_path / "in").mkdir()
    code = cli.main(["run", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"), "--extract", "false",
                     flag, "-1"])
    assert code == 2 and f"{flag} -1 is negative" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
