"""RunTables (transforms/store/run_tables.py): one run's tables. Without a catalog its commit steps do nothing;
`--force`'s clear removes the run's part files and listing in one call, and no other run's or tenant's."""
from __future__ import annotations

from pathlib import Path

from schemas import tables
from schemas.layout import partition
from schemas.run_place import RunPlace
from transforms.store.files import run_files
from transforms.store.run_tables import RunTables
from transforms.store.write import write_rows


def test_clear_takes_the_runs_files_and_listing_only(tmp_path: Path) -> None:
    out = str(tmp_path)
    place = RunPlace(out, "acme", "r1")
    for tenant, run_id in (("acme", "r1"), ("acme", "r2"), ("bravo", "r1")):
        for table in ("documents", "pages"):
            write_rows(partition(out, table, tenant, run_id), tables.SCHEMAS[table],
                       [{"tenant": tenant, "run_id": run_id}])
    listing = Path(place.listing_folder())
    listing.mkdir(parents=True)
    (listing / "wave-00000.parquet").write_bytes(b"x")
    (listing / "wave-00000.done").write_bytes(b"done\n")

    run = RunTables(place, None)
    assert not run.mirrored and run.refusal() is None and run.catalog_record() is None
    assert run.committed_waves() == set()
    run.wave_done(0)  # nothing to commit without a catalog
    run.run_settled([], wave=0)
    assert run.clear() == 2  # one part file of each table
    assert [run_files(out, t, "acme", "r1") for t in ("documents", "pages")] == [[], []]
    assert list(listing.iterdir()) == []
    for tenant, run_id in (("acme", "r2"), ("bravo", "r1")):
        assert [len(run_files(out, t, tenant, run_id)) for t in ("documents", "pages")] == [1, 1]
    assert run.misfiled() == {}
