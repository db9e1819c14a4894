"""Drill: the output's disk fills up while a run writes. The run fails with one clear line and a
non-zero exit, nothing half-written is left for a reader, and once there is room again the same
command (same --run-id) finishes the run with one row per key."""
from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from apache_beam.io.filesystems import FileSystems

from pipelines import cli
from tests.support import docmaker
from tests.support.disk_faults import FullDisk
from tests.support.row_keys import assert_one_row_per_key


def make_inputs(folder: Path, docs: int) -> int:
    folder.mkdir()
    pages = 0
    for i in range(docs):
        n = 1 + i % 3
        (folder / f"doc-{i:02d}.pdf").write_bytes(docmaker.multipage_pdf(n, title=f"Report {i}"))
        pages += n
    (folder / "corrupt.pdf").write_bytes(docmaker.truncated_pdf())
    return pages


def run(inputs: Path, output: Path, *flags: str) -> int:
    # --workers 1: the full disk is injected in this process, so the writers must run here too.
    return cli.main(["run", "--input", str(inputs), "--output", str(output), "--run-id", "d1", "--extract", "false",
                     "--hints", "text_layer", "--progress-every-s", "0", "--flush-rows", "1", "--workers", "1",
                     *flags])


def assert_nothing_half_written(output: Path) -> None:
    # The run's listing markers (`_LISTED`, `wave-N.done`: transforms/store/listing_file.py) are whole files too.
    # The run's log beside its manifest (pipelines/run/run_log.py) is appended to, never read as a table.
    leftovers = [p for p in output.rglob("*") if p.is_file() and not p.name.endswith((".parquet", ".json", ".done"))
                 and p.name != "_LISTED" and p != output / "runs" / "tenant=default" / "d1.log"]
    assert leftovers == []
    for path in output.rglob("*.parquet"):
        pq.read_table(path)  # every file a reader can see is whole
    assert list(output.rglob("*.json")) == []  # a failed run has no manifest


def failure_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("pagemill: run d1 failed")]


class _FullAfter:
    """A fault injector: Parquet files beyond the first `room` fail with ENOSPC half-way through."""

    def __init__(self, real, room: int) -> None:
        self.real, self.room = real, room

    def __call__(self, path: str, *args, **kwargs):
        handle = self.real(path, *args, **kwargs)
        if ".parquet" not in path:
            return handle
        self.room -= 1
        return handle if self.room >= 0 else FullDisk(handle, path)


def test_injected_full_disk_fails_the_run_cleanly_and_the_rerun_finishes_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    inputs, output = tmp_path / "in", tmp_path / "out"
    pages = make_inputs(inputs, 6)
    with monkeypatch.context() as patch:
        patch.setattr(FileSystems, "create", _FullAfter(FileSystems.create, room=3))
        assert run(inputs, output) == 1
    (line,) = failure_lines(capsys.readouterr().err)
    assert "no space left on the output's storage" in line and "--run-id d1" in line
    assert_nothing_half_written(output)

    assert run(inputs, output) == 0  # room again: the same command finishes the run
    assert_one_row_per_key(output, "d1", listed=7, pages=pages)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 8 MiB tmpfs (needs root and a kernel that lets this sandbox mount; skipped elsewhere)."""
    mount = tmp_path / "small"
    mount.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount)],
                                           capture_output=True).returncode != 0:
        pytest.skip("cannot mount a small tmpfs here")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.mark.slow
def test_real_full_disk_fails_the_run_cleanly_and_the_rerun_finishes_it(
        small_disk: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inputs, output = tmp_path / "in", small_disk / "out"
    pages = make_inputs(inputs, 24)
    filler = small_disk / "filler"
    free = os.statvfs(small_disk).f_bavail * os.statvfs(small_disk).f_frsize
    filler.write_bytes(b"\0" * (free - 96 * 1024))  # room for the pre-flight probe and a few files only
    assert run(inputs, output) == 1
    (line,) = failure_lines(capsys.readouterr().err)
    assert "no space left on the output's storage" in line
    assert_nothing_half_written(output)
    assert any(output.rglob("*.parquet"))  # the premise: the disk filled midway, not before the run

    filler.unlink()
    assert run(inputs, output) == 0
    assert_one_row_per_key(output, "d1", listed=25, pages=pages)
