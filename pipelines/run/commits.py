"""Moved: a run's Iceberg commits are transforms/store/commits.py's, driven by the run's RunTables
(transforms/store/run_tables.py); the launcher names no committer. Its names stay importable from here."""
from __future__ import annotations

from transforms.store.commits import COMMIT_ORDER as COMMIT_ORDER
from transforms.store.commits import Commits as Commits
