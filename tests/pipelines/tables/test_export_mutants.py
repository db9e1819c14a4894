"""`pagemill export`'s arguments and `--to`'s resolution (mutants that made `--output` optional, or took a
`file://` URI for an object store's key, so that a symlink it names was not followed, or split a key at its
last `://`, survived `make mutate`; docs/development.md "Mutation score")."""
from __future__ import annotations

from pathlib import Path

import pytest

from pipelines import cli
from pipelines.tables.export import resolved, target_problem


def test_export_without_output_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["export", "--schema", "invoice", "--to", str(tmp_path / "x.parquet")])
    assert exit_.value.code == 2
    assert "--output" in capsys.readouterr().err and not (tmp_path / "x.parquet").exists()


def test_a_file_uri_is_resolved_as_a_local_path(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert resolved(f"file://{tmp_path}/link/x.csv") == ("file", str((tmp_path / "real" / "x.csv").resolve()))


def test_a_file_uri_through_a_symlink_into_the_output_root_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / "runs").mkdir(parents=True)
    (tmp_path / "exports").symlink_to(out / "runs")
    problem = target_problem(str(out), f"file://{tmp_path}/exports/x.parquet")
    assert problem is not None and f"resolves to {(out / 'runs').resolve()}/x.parquet" in problem


def test_a_key_with_a_scheme_like_part_is_still_inside_the_root() -> None:
    """An object key may hold `://` (keys are any text): the scheme is what comes before the first one."""
    assert resolved("s3://b/out/a://b.csv") == ("s3", "b/out/a://b.csv")
    assert target_problem("s3://b/out", "s3://b/out/runs/x://y.json") is not None
