"""Pre-flight: each problem is one clear line and exit code 2, before any pipeline starts."""
from __future__ import annotations

from pathlib import Path

import pytest

from pipelines import cli
from tests import docmaker


@pytest.fixture()
def inputs(tmp_path: Path) -> Path:
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.png").write_bytes(docmaker.tiny_png())
    return folder


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = cli.main(["run", *args])
    return code, capsys.readouterr().err


def test_missing_input_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run(capsys, "--input", str(tmp_path / "nope"), "--output", str(tmp_path / "out"), "--extract", "false")
    assert code == 2 and f"input {tmp_path / 'nope'}: no such file or folder" in err


def test_output_that_cannot_be_written(inputs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("a file, not a folder")
    code, err = run(capsys, "--input", str(inputs), "--output", str(blocker / "out"), "--extract", "false")
    assert code == 2 and f"output {blocker / 'out'}: cannot write" in err


def test_bad_blocklist_line(inputs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.list"
    bad.write_text("# comment\nsha256:nothex\n")
    code, err = run(capsys, "--input", str(inputs), "--output", str(tmp_path / "out"), "--extract", "false",
                    "--blocklist", str(bad))
    assert code == 2 and "line 2" in err and "sha256:nothex" in err
    assert not (tmp_path / "out").exists()


def test_missing_local_model(inputs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run(capsys, "--input", str(inputs), "--output", str(tmp_path / "out"), "--model",
                    str(tmp_path / "no-model"))
    assert code == 2 and "no such model folder" in err
