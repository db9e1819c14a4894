"""What mutants of the run partitions' code showed untested (`make mutate`; docs/development.md "Mutation
score"): clear_run counts every file it deletes, across files and tables (mutants that counted one table's files,
or deleted the partition folder as one entry, survived), and the compacted file keeps the table's schema."""
from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq

from schemas import tables
from schemas.layout import partition
from transforms.store.compaction import clear_run, compact_run
from transforms.store.files import run_files
from transforms.store.write import write_rows


def test_clear_run_deletes_and_counts_every_part_file_of_every_table(tmp_path: Path) -> None:
    out = str(tmp_path)
    for outcome in ("failed", "extracted"):  # two part files in documents
        row = {"run_id": "r1", "tenant": "acme", "source_uri": "a.pdf", "outcome": outcome}
        write_rows(partition(out, "documents", "acme", "r1"), tables.DOCUMENTS, [row])
    write_rows(partition(out, "pages", "acme", "r1"), tables.PAGES,
               [{"run_id": "r1", "tenant": "acme", "source_uri": "a.pdf", "page_index": 0, "status": "ok"}])
    assert len(run_files(out, "documents", "acme", "r1")) == 2 and len(run_files(out, "pages", "acme", "r1")) == 1
    assert clear_run(out, "acme", "r1") == 3
    assert run_files(out, "documents", "acme", "r1") == [] and run_files(out, "pages", "acme", "r1") == []
    assert clear_run(out, "acme", "r1") == 0


def test_the_compacted_file_has_the_tables_schema(tmp_path: Path) -> None:
    """The file that replaces a run's parts is typed as the table (schemas/tables.py), not as pyarrow would infer
    from its rows: a column that is null in every kept row keeps its type, so readers that union the run's files
    with other runs' see one schema."""
    out = str(tmp_path)
    for outcome in ("failed", "extracted"):  # message, page_count, ...: null in every row
        write_rows(partition(out, "documents", "acme", "r1"), tables.DOCUMENTS,
                   [{"run_id": "r1", "tenant": "acme", "source_uri": "a.pdf", "outcome": outcome}])
    assert compact_run(out, "acme", "r1") == {"documents": 1}
    (compacted,) = run_files(out, "documents", "acme", "r1")
    assert pq.read_schema(compacted).remove_metadata().equals(tables.DOCUMENTS.remove_metadata())


def test_a_runs_files_and_its_compaction_leave_the_tenants_other_runs_alone(tmp_path: Path) -> None:
    out = str(tmp_path)
    for run_id in ("r1", "r2"):
        for outcome in ("failed", "extracted"):
            write_rows(partition(out, "documents", "acme", run_id), tables.DOCUMENTS,
                       [{"run_id": run_id, "tenant": "acme", "source_uri": "a.pdf", "outcome": outcome}])
    r2 = run_files(out, "documents", "acme", "r2")
    assert len(r2) == 2 and all("/run_id=r2/" in f for f in r2)
    assert compact_run(out, "acme", "r1") == {"documents": 1}
    assert run_files(out, "documents", "acme", "r2") == r2
