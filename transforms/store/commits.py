"""`--catalog`: a run's tables committed to Iceberg (transforms/store/iceberg.py) wave by wave, driven by the run's
RunTables (transforms/store/run_tables.py), the launcher's one handle on them.

At a wave's end, after its pipeline finished and before the wave is marked done: the wave's own part files that
hold a key twice (a retried bundle, a resumed wave's second attempt) are compacted by the kept-row rule, then
each table's partition of the run is committed as it lies on disk, one snapshot per table (`pages`, `ledger`,
then `documents`: a wave's `documents` snapshot says the whole wave is in). At the run's end, after its
compaction, the same commit again: nothing when nothing changed, else one overwrite per changed table. A table
whose rows contradict each other (transforms/store/duplicates.py IDENTITY) is not committed: its rows stay on
disk as the evidence, the run exits 1, and the catalog never holds a key twice. A compaction here keeps the files it
replaced (earlier snapshots may name them; `pagemill expire` deletes them). Before the run works, `refusal` says
whether the catalog can be used at all (a class it names, a table not pagemill's: exit 2).
"""
from __future__ import annotations

import logging
import time
from typing import Any

from schemas import layout, tables
from transforms.store import iceberg
from transforms.store.part_names import wave_of

log = logging.getLogger(__name__)
# `documents` last: its snapshot of a wave is the sign that the wave's other tables are all committed.
COMMIT_ORDER = ("evidence", "pages", "ledger", "documents")


class Commits:
    """One run's commits: what the catalog already holds, each wave's commit, the run's last one."""

    def __init__(self, config: iceberg.CatalogConfig, output: str, storage: Any, tenant: str, run_id: str) -> None:
        self.config, self.output, self.storage, self.tenant, self.run_id = config, output, storage, tenant, run_id
        self.seconds: dict[int, float] = {}  # wave -> seconds its compaction and commit took
        self.held: set[str] = set()  # tables not committed: their rows contradict each other
        self._catalog: Any = None

    @property
    def catalog(self) -> Any:
        if self._catalog is None:
            self._catalog = iceberg.open_catalog(self.config, self.output, self.storage)
        return self._catalog

    def refusal(self) -> str | None:
        """Why the catalog cannot take this run's commits, said before the run works (exit 2): a class its server
        or a table's properties name (transforms/store/catalog.py), a table not partitioned as pagemill makes
        it (iceberg.table_problems). Opens the catalog (the embedded one and the namespace are made)."""
        try:
            for table in COMMIT_ORDER:
                iceberg.existing_table(self.catalog, self.config.namespace, table)
        except iceberg.CatalogRefused as err:
            return str(err)
        return None

    def committed_waves(self) -> set[int]:
        """The waves whose `documents` snapshot is in the catalog (committed before a kill, say)."""
        return iceberg.committed_waves(self.catalog, self.config.namespace, "documents", self.tenant, self.run_id)

    def wave_done(self, wave: int) -> None:
        """Compact the wave's own files where a key has two rows, then commit the run's partitions."""
        from transforms.store.compaction import compact_files, key_problems, read_rows
        from transforms.store.duplicates import IDENTITY
        from transforms.store.part_names import compacted_prefix

        started = time.perf_counter()
        for table in tables.TABLES:
            own = [f for f in self._files(table) if _wave_of(f) == wave]
            if len(own) < 2 or table in self.held:
                continue
            identity = IDENTITY.get(table)
            checked = [*layout.TABLE_KEYS[table], *([identity] if identity else [])]  # not the hints and answers
            twice, contradictions = key_problems(read_rows(own, table, checked), table, identity)
            if contradictions:
                log.warning("iceberg: %s of run %s holds %d key(s) whose rows contradict each other: not committed",
                            table, self.run_id, contradictions)
                self.held.add(table)
            elif twice:
                # The replaced files stay for whatever snapshot names them (a resumed wave's first attempt).
                compact_files(self.output, table, self.tenant, self.run_id, own, compacted_prefix(wave),
                              keep_replaced=True)
        self._commit("wave", wave)
        self.seconds[wave] = round(time.perf_counter() - started, 3)

    def run_settled(self, contradicted: list[str], wave: int | None = None) -> None:
        """After the run's compaction: commit what changed (`wave` 0 for a run without waves: its one commit).
        `contradicted`: the tables the run's errors name."""
        self.held |= {t for t in tables.TABLES if any(line.startswith(f"{t}:") for line in contradicted)}
        started = time.perf_counter()
        self._commit("wave" if wave is not None else "compaction", wave)
        if wave is not None:
            self.seconds[wave] = round(time.perf_counter() - started, 3)

    def cleared(self) -> None:
        """`--force` deleted the run's files: the catalog lets go of them (one overwrite per table)."""
        self._commit("clear", None)

    def record(self) -> dict[str, Any]:
        """The manifest's `catalog`: where the tables were committed and what each wave's commit took."""
        from transforms.text_safety import redact_url

        return {"uri": redact_url(self.config.uri), "namespace": self.config.namespace,
                "commit_seconds": {str(w): s for w, s in sorted(self.seconds.items())},
                "not_committed": sorted(self.held)}

    def _files(self, table: str) -> list[str]:
        from transforms.store.files import run_files

        return run_files(self.output, table, self.tenant, self.run_id)

    def _commit(self, action: str, wave: int | None) -> None:
        for table in COMMIT_ORDER:
            if table in self.held:
                continue
            iceberg.sync(self.catalog, self.config.namespace, table, self.tenant, self.run_id, self._files(table),
                         action, wave)


def _wave_of(path: str) -> int | None:
    return wave_of(path)
