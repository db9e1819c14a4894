"""The tables' room: where a run's tables live and how they are committed (transforms/store/iceberg.py)."""
