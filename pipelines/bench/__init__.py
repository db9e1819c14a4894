"""Public benchmarks in their own layouts (olmOCR-Bench, SROIE task 3, CORD v2): readers, scorers that give the
benchmarks' own numbers, and the `pagemill bench` / `pagemill eval --bench` commands (docs/benchmarks.md)."""
