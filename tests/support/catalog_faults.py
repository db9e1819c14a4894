"""Faults for the catalog tests, in the run's commit step (transforms/store/commits.py), run as
`python -m tests.support.catalog_faults MODE WAVE run ...`:

- `kill-before-commit`: SIGKILL once the wave's pipeline finished and its files are on disk, before its commit;
- `kill-after-commit`: SIGKILL right after the wave's commit, before the wave is marked done;
- `replay`: before the wave's commit, one of its `pages` and `ledger` part files is written a second time under
  another name (a runner that retried a bundle after its writer flushed);
- `kill-between-commits`: SIGKILL right after the wave's `pages` snapshot is committed, before its `ledger` and
  `documents` ones (a wave's tables are committed one after another: transforms/store/iceberg.py `sync`).
"""
from __future__ import annotations

import inspect
import os
import shutil
import signal
import sys
import uuid
from typing import Any

from transforms.store import commits, iceberg
from transforms.store.write import part_prefix


def faulty(mode: str, wave: int) -> type[commits.Commits]:
    class Faulty(commits.Commits):
        def wave_done(self, done: int) -> None:
            if done == wave and mode == "kill-before-commit":
                os.kill(os.getpid(), signal.SIGKILL)
            if done == wave and mode == "replay":
                for table in ("pages", "ledger"):
                    own = [f for f in self._files(table) if f.rsplit("/", 1)[-1].startswith(part_prefix(wave))]
                    folder = own[0].rsplit("/", 1)[0]
                    shutil.copyfile(own[0], f"{folder}/{part_prefix(wave)}{uuid.uuid4().hex}.parquet")
            super().wave_done(done)
            if done == wave and mode == "kill-after-commit":
                os.kill(os.getpid(), signal.SIGKILL)

    return Faulty


def killed_after_table(table: str, wave: int) -> Any:
    """`iceberg.sync` that kills the process once it committed a snapshot of `table` for `wave`."""
    real = iceberg.sync
    signature = inspect.signature(real)

    def sync(*args: Any, **kwargs: Any) -> Any:
        snapshot = real(*args, **kwargs)
        called = signature.bind(*args, **kwargs).arguments
        if snapshot is not None and called["table"] == table and called.get("wave") == wave:
            os.kill(os.getpid(), signal.SIGKILL)
        return snapshot

    return sync


def main(argv: list[str]) -> int:
    from pipelines import cli

    mode, wave, *args = argv
    if mode == "kill-between-commits":
        iceberg.sync = killed_after_table("pages", int(wave))  # type: ignore[assignment]
    else:
        commits.Commits = faulty(mode, int(wave))  # type: ignore[misc]
    return cli.main(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
