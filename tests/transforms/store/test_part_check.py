"""Issue 42 row 1: a part file belongs to the folder it lies in (transforms/store/part_check.py), and every listing
(transforms/store/files.py) leaves out a file whose rows say otherwise, and the files a compaction with a catalog
kept for older snapshots."""
from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from schemas import layout, tables
from transforms.store import files, part_check


def _file(root: Path, tenant: str, run_id: str, rows: list[tuple[str | None, str | None]], name: str = "part-x",
          statistics: bool = True) -> str:
    folder = Path(layout.partition(str(root), "ledger", tenant, run_id))
    folder.mkdir(parents=True, exist_ok=True)
    data = pa.Table.from_pylist([{"tenant": t, "run_id": r, "doc_sha256": f"d{i}", "page_index": 0}
                                 for i, (t, r) in enumerate(rows)], schema=tables.LEDGER)
    path = folder / f"{name}.parquet"
    pq.write_table(data, path, write_statistics=statistics)
    return str(path)


def _problem(path: str) -> str | None:
    return part_check.file_problem(path, lambda: open(path, "rb"))


@pytest.mark.parametrize(("rows", "statistics", "problem"), [
    ([("alpha", "a1")] * 3, True, None),
    ([], True, None),
    ([("bravo", "b1")], True, "tenant=bravo"),
    ([("bravo", "b1")], False, "tenant=bravo"),  # no statistics: the column itself is read
    ([("alpha", "a1"), ("bravo", "a1")], True, "tenant=bravo"),  # one stranger among its own rows
    ([("alpha", "a1"), ("alpha", "b1")], False, "run_id=b1"),
    ([("alpha", "a1"), (None, "a1")], True, "have no tenant"),
])
def test_a_file_whose_rows_are_not_its_folders_is_refused(tmp_path: Path, rows: list, statistics: bool,
                                                          problem: str | None) -> None:
    found = _problem(_file(tmp_path, "alpha", "a1", rows, statistics=statistics))
    assert (found is None) if problem is None else (problem in (found or ""))


def test_statistics_that_agree_prove_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The footer is what the file's writer says: with statistics that claim alpha (as a forged footer would),
    the rows saying bravo still keep the file out."""
    path = _file(tmp_path, "alpha", "a1", [("bravo", "b1")])
    monkeypatch.setattr(part_check, "_statistics_problem", lambda metadata, want: None)
    assert "tenant=bravo" in (part_check.rows_problem(pq.ParquetFile(path), "alpha", "a1") or "")


@pytest.mark.parametrize(("path", "folder"), [
    ("/o/ledger/tenant=a/run_id=r/part-1.parquet", ("a", "r")),
    ("s3://b/tenant=x/ledger/tenant=a/run_id=r/part-1.parquet", ("a", "r")),
    ("/o/ledger/tenant=a/run_id=r/deeper/part-1.parquet", None),
    ("/o/ledger/run_id=r/tenant=a/part-1.parquet", None),
    ("/o/ledger/part-1.parquet", None)])
def test_folder_partition(path: str, folder: tuple[str, str] | None) -> None:
    assert part_check.folder_partition(path) == folder


def test_every_listing_leaves_out_a_misfiled_file(tmp_path: Path) -> None:
    own = _file(tmp_path, "alpha", "a1", [("alpha", "a1")], name="part-own")
    planted = _file(tmp_path, "alpha", "a1", [("bravo", "b1")], name="part-planted")
    nested = Path(own).parent / "run_id=b1"  # a folder of alpha's that names another run: not a partition
    nested.mkdir()
    stray = nested / "part-stray.parquet"
    stray.write_bytes(Path(own).read_bytes())
    assert files.run_files(str(tmp_path), "ledger", "alpha", "a1") == [own]
    assert files.tenant_files(str(tmp_path), "ledger", "alpha") == [own]
    assert files.table_files(pafs.LocalFileSystem(), str(tmp_path), "ledger") == [own]
    assert set(files.misfiled_run_files(str(tmp_path), "alpha", "a1")) == {planted}


def test_a_replaced_file_is_left_out_only_while_its_replacement_is_there(tmp_path: Path) -> None:
    old = [_file(tmp_path, "alpha", "a1", [("alpha", "a1")], name=f"part-{i}") for i in range(2)]
    folder = Path(old[0]).parent
    sidecar = folder / f"part-compacted-x{files.REPLACES_SUFFIX}"
    sidecar.write_text(files.sidecar_text(old))
    fs = pafs.LocalFileSystem()
    assert files.table_files(fs, str(tmp_path), "ledger") == sorted(old)  # no part-compacted-x.parquet yet
    new = _file(tmp_path, "alpha", "a1", [("alpha", "a1")], name="part-compacted-x")
    assert files.table_files(fs, str(tmp_path), "ledger") == [new]
    assert files.run_files(str(tmp_path), "ledger", "alpha", "a1") == [new]
    assert files.replaced_files(fs, str(tmp_path), "ledger") == {str(sidecar): sorted(old)}
    sidecar.write_text(json.dumps(["../../../tenant=bravo/run_id=b1/part-0.parquet", 7]))  # names only, its folder
    assert files.table_files(fs, str(tmp_path), "ledger") == sorted([*old, new])
