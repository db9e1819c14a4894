"""RunTables: one run's tables and every change the launcher makes to them, the way pyiceberg's `Table` or
delta-rs's `DeltaTable` own theirs.

The launcher (pipelines/run/run.py, waves.py) holds one per run, made from the run's RunPlace, and names no file,
compaction or committer itself: `--force`'s clear (files, listing and the catalog's hold on them, in one call), the
waves a catalog already holds, a wave done (its own retried rows compacted, then committed), the run settled
(what its compaction changed committed), the catalog mirror's and the misfiled files' manifest entries. Without
`--catalog` the commit steps do nothing. The committer is transforms/store/commits.py, looked up at call time
(tests/support/catalog_faults.py plants faults there).
"""
from __future__ import annotations

from typing import Any

from schemas.run_place import RunPlace
from transforms.store import commits as commits_module
from transforms.store.catalog import CatalogConfig


class RunTables:
    """One run's tables under its output root, and, with `catalog`, their Iceberg mirror kept in step."""

    def __init__(self, place: RunPlace, storage: Any, catalog: CatalogConfig | None = None) -> None:
        self.place, self.storage = place, storage
        self.commits: Any = None if catalog is None else \
            commits_module.Commits(catalog, place.output, storage, place.tenant, place.run_id)

    @property
    def mirrored(self) -> bool:
        """Whether a catalog mirrors the run's tables (a compaction then keeps the files it replaced)."""
        return self.commits is not None

    def refusal(self) -> str | None:
        """Why the catalog cannot take this run's commits (exit 2 before the run works), or None."""
        return self.commits.refusal() if self.commits is not None else None

    def clear(self) -> int:
        """`--force`: the run's part files and listing deleted, and the catalog lets go of them (it must not point
        at the files just deleted). Returns the part files deleted."""
        from transforms.store.compaction import clear_run
        from transforms.store.listing_file import clear_listing

        removed = clear_run(self.place.output, self.place.tenant, self.place.run_id)
        clear_listing(self.place.listing_folder())
        if self.commits is not None:
            self.commits.cleared()
        return removed

    def committed_waves(self) -> set[int]:
        """The waves the catalog already holds (a kill between a wave's commit and its mark): none without one."""
        return self.commits.committed_waves() if self.commits is not None else set()

    def wave_done(self, wave: int) -> None:
        """After a wave's pipeline, before it is marked done: its retried rows compacted and its tables committed."""
        if self.commits is not None:
            self.commits.wave_done(wave)

    def run_settled(self, errors: list[str], wave: int | None = None) -> None:
        """After the run's compaction: what changed committed (`wave` 0: a run without waves, its one commit).
        `errors`: the run's, whose contradicted tables stay uncommitted. Raises what the catalog raised."""
        if self.commits is not None:
            self.commits.run_settled(errors, wave=wave)

    def catalog_record(self) -> dict[str, Any] | None:
        """The manifest's `catalog` (None without one)."""
        return self.commits.record() if self.commits is not None else None

    def misfiled(self) -> dict[str, str]:
        """The manifest's `misfiled_files`: part files in the run's folders whose rows are not the run's."""
        from transforms.store.files import misfiled_run_files

        return misfiled_run_files(self.place.output, self.place.tenant, self.place.run_id)
