"""An atomic manifest write (transforms/store/manifest_file.py `write`) whose writer is killed between writing its
temporary file and renaming it (issue 43): the temporary file is named so that no reader takes it for a manifest,
so the run is counted once, with the manifest it had. The kill is a fault injected in the writer: the rename never
happens and nothing cleans up (a SIGKILL runs no `except`)."""
from __future__ import annotations

from pathlib import Path

import pyarrow.fs as pafs
import pytest
from apache_beam.io.filesystems import FileSystems

from pipelines.tables.manifest import write_manifest
from pipelines.tables.sql import runs_table
from transforms.store import manifest_file
from transforms.store.files import manifest_files

FIRST = {"run_id": "r1", "documents": 3, "started_at": "2026-12-01T10:00:00+00:00",
         "finished_at": "2026-12-01T10:01:00+00:00", "options": {"tenant": "acme"}}


class Killed(BaseException):
    """The writer's process ends here."""


def killed_rewrite(out: str, monkeypatch: pytest.MonkeyPatch) -> None:
    def rename(*args: object, **kwargs: object) -> None:
        raise Killed

    with monkeypatch.context() as patch:
        patch.setattr(FileSystems, "rename", rename)
        patch.setattr(FileSystems, "delete", lambda *a, **k: None)  # no cleanup after a kill
        with pytest.raises(Killed):
            write_manifest(out, "acme", "r1", {**FIRST, "documents": 4})


def test_a_writer_killed_before_its_rename_leaves_one_manifest_a_run(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    out = str(tmp_path / "out")
    uri = write_manifest(out, "acme", "r1", FIRST)
    killed_rewrite(out, monkeypatch)
    left = sorted(p.name for p in Path(uri).parent.iterdir())
    assert len(left) == 2 and "r1.json" in left, left  # the fault did leave the temporary file behind
    fs = pafs.LocalFileSystem()
    assert [p for p, _ in manifest_files(fs, out, "acme")] == [uri]
    assert [p for p, _ in manifest_files(fs, out)] == [uri]
    for tenant in ("acme", None):
        runs = runs_table(fs, out, tenant).to_pylist()
        assert [(r["run_id"], r["documents"]) for r in runs] == [("r1", 3)], tenant


def test_the_temporary_file_is_no_manifest_by_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not `*.json`, what every reader of the runs lists (transforms/store/files.py manifest_files)."""
    out = str(tmp_path / "out")
    uri = write_manifest(out, "acme", "r1", FIRST)
    killed_rewrite(out, monkeypatch)
    (temporary,) = [p for p in Path(uri).parent.iterdir() if p.name != "r1.json"]
    assert not temporary.name.endswith(".json")
    assert manifest_file.parse(temporary.read_bytes())[0]["documents"] == 4  # it is the new manifest's bytes
