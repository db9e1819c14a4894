"""A fault for the wave tests: the run's `documents` writer stops once `n` rows of one wave are on disk, so that
a run is cut short inside that wave (after some of its documents are written, before the rest), not between
waves. It stops by raising (the run fails, as on a full disk) or by blocking until the test kills the process
(`python -m tests.support.wave_faults WAVE N MARKER run ...`: it writes MARKER once blocked). Only where the
writer runs in this process (`--workers 1`).

With `--flush-rows 1` each documents row is its own file, so exactly `n` rows of the wave are written."""
from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

from schemas import tables
from transforms.store import write


class StopDocuments:
    """`write_rows` of transforms/store/write.py, stopping before the wave's `n + 1`-th documents row."""

    def __init__(self, wave: int, n: int, marker: Path | None = None) -> None:
        self.prefix, self.n, self.marker = write.part_prefix(wave), n, marker
        self.written = 0
        self.real = write.write_rows

    def __call__(self, folder: str, schema: Any, rows: list[dict[str, Any]], name: str | None = None) -> str:
        if schema is tables.DOCUMENTS and name is not None and name.startswith(self.prefix):
            if self.written + len(rows) > self.n:
                self.stop()
            self.written += len(rows)
        return self.real(folder, schema, rows, name)

    def stop(self) -> None:
        if self.marker is None:
            raise RuntimeError(f"injected: the documents writer stops after {self.n} rows of {self.prefix}")
        self.marker.write_text(f"{self.written}\n")
        threading.Event().wait()  # until SIGKILL


def main(argv: list[str]) -> int:
    from pipelines import cli

    wave, n, marker, *args = argv
    write.write_rows = StopDocuments(int(wave), int(n), Path(marker))  # type: ignore[assignment]
    return cli.main(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
