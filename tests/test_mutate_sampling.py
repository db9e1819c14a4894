"""scripts/mutate.py's `--sample N --seed S`: the same seed draws the same mutants, a larger N extends a smaller
sample, every module gets its own N, and the score's 95% Wilson interval (values from the formula's published
tables, not from the script)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

spec = importlib.util.spec_from_file_location("mutate", Path(__file__).resolve().parents[1] / "scripts" / "mutate.py")
assert spec is not None and spec.loader is not None
mutate = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mutate)

RESULTS = "\n".join(
    [f"    pipelines.run.waves.x_wave_of__mutmut_{i}: {'killed' if i % 3 else 'survived'}" for i in range(1, 41)]
    + [f"    transforms.store.files.xǁRootǁopen__mutmut_{i}: not checked" for i in range(1, 8)]
    + ["    pipelines.tables.export.x_read__mutmut_1: timeout", "unrelated line"])


def test_statuses_reads_module_and_status_of_each_mutant() -> None:
    names = mutate.statuses(RESULTS)
    assert len(names) == 48
    assert names["pipelines.run.waves.x_wave_of__mutmut_3"] == ("pipelines.run.waves", "survived")
    assert names["transforms.store.files.xǁRootǁopen__mutmut_2"] == ("transforms.store.files", "not checked")


def test_a_sample_is_reproducible_per_module_and_grows_by_extension() -> None:
    names = mutate.statuses(RESULTS)
    small, large = mutate.draw(names, [], 5, seed=7), mutate.draw(names, [], 10, seed=7)
    assert small == mutate.draw(names, [], 5, seed=7)
    assert set(small) <= set(large)
    by_module = [n.rsplit(".x", 1)[0] for n in large]
    assert by_module.count("pipelines.run.waves") == 10 and by_module.count("transforms.store.files") == 7
    assert by_module.count("pipelines.tables.export") == 1
    assert mutate.draw(names, [], 5, seed=8) != small  # another seed, another sample
    assert {n.rsplit(".x", 1)[0] for n in mutate.draw(names, ["pipelines.run.*"], 5, seed=7)} == \
        {"pipelines.run.waves"}


@pytest.mark.parametrize("killed, n, low, high", [(0, 10, 0.0, 0.2775), (10, 10, 0.7225, 1.0),
                                                  (8, 10, 0.4902, 0.9433), (35, 40, 0.7389, 0.9454)])
def test_wilson_interval(killed: int, n: int, low: float, high: float) -> None:
    assert mutate.wilson(killed, n) == pytest.approx((low, high), abs=5e-4)


def test_the_sample_table_counts_only_mutants_that_ran() -> None:
    names = mutate.statuses(RESULTS)
    sample = [f"pipelines.run.waves.x_wave_of__mutmut_{i}" for i in (1, 2, 3)] + \
             ["transforms.store.files.xǁRootǁopen__mutmut_1"]
    lines = mutate.sample_table(names, sample)
    waves = next(line for line in lines if line.startswith("pipelines.run.waves"))
    assert waves.split()[1:4] == ["3", "2", "67%"]
    files = next(line for line in lines if line.startswith("transforms.store.files"))
    assert files.split()[1:4] == ["0", "0", "-"] and files.split()[-1] == "1"  # not run
    assert "  pipelines.run.waves.x_wave_of__mutmut_3: survived" in lines
