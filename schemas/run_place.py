"""RunPlace: which run a launcher drives, as one value: its output root, tenant and run id.

Made once per run (pipelines/run/run.py, the run id new unless --run-id names one), held in RunSettings
(pipelines/run/settings.py) and handed on as one value where the three used to travel loose. Its paths are
schemas/layout.py's (the hive partition `<output>/<table>/tenant=<tenant>/run_id=<run_id>/`).
"""
from __future__ import annotations

from dataclasses import dataclass

from schemas import layout


@dataclass(frozen=True)
class RunPlace:
    """One run of one tenant under one output root (identifiers are checked by the options before it is made)."""

    output: str
    tenant: str
    run_id: str

    def partition(self, table: str) -> str:
        """The folder of this run's files of `table`."""
        return layout.partition(self.output, table, self.tenant, self.run_id)

    def listing_folder(self) -> str:
        """This run's durable listing (transforms/store/listing_file.py)."""
        return layout.listing_folder(self.output, self.tenant, self.run_id)
