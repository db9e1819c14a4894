"""Output: document outcomes, the cross-run cache, the Parquet tables, run-root housekeeping, progress."""
