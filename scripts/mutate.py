#!/usr/bin/env python
"""Mutation score of the stage modules that changed most (`make mutate`; not part of CI).

Runs mutmut (configured under [tool.mutmut] in pyproject.toml: transforms/extract/feed, engines/vllm_machine,
output/cache, document_work/timed, safety/gate and model/prompt; the waves and exactly-once modules
pipelines/run/waves and retries, store/compaction and progress, store/listing_file, pipelines/tables/typed_views
and export, extract/stage; each against its fast tests only), then prints,
per module, how many mutants the tests killed. A mutant that makes the tests time out counts as killed; one
that no test reaches ("no tests") counts as surviving.

    python scripts/mutate.py                               # every module (CPU heavy: nice it)
    python scripts/mutate.py "transforms.model.prompt*"    # one module
    python scripts/mutate.py "pipelines.run.retries*"      # one module under pipelines/
    python scripts/mutate.py --summary-only                # the table from the last run
    python scripts/mutate.py --sample 40 --seed 1 "pipelines.run.waves*" "pipelines.tables.export*"

`--sample N --seed S` scores a reproducible random sample where a full run takes too long (a mutant that a
pipeline run reaches costs 30-80 s on 2 cores): it generates the mutants if none are listed yet, takes the first N
of each module's mutant names shuffled by `random.Random(f"{S}:{module}")` (so a larger N extends a smaller
sample), runs those without a result yet, and prints killed/sampled per module with a 95% Wilson interval and the
sample's survivors.
"""
from __future__ import annotations

import argparse
import fnmatch
import math
import os
import random
import re
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
KILLED = {"killed", "timeout", "caught by type check", "segfault"}
NOT_RUN = {"not checked", "skipped", "check was interrupted by user"}
# A mutant is `<module>.x_<function>__mutmut_<n>` or `<module>.xǁ<Class>ǁ<method>__mutmut_<n>`.
LINE = re.compile(r"^\s*((?:transforms|pipelines|schemas)(?:\.\w+)*?)\.x[_ǁ]\S*__mutmut_\d+: (.+?)\s*$")
NAME = re.compile(r"^\s*(((?:transforms|pipelines|schemas)(?:\.\w+)*?)\.x[_ǁ]\S*__mutmut_\d+): (.+?)\s*$")
# mutmut 3 has no command that only generates mutants (`run` also runs every selected test once for its
# stats): its own first step, called in-process, so that a sample can be drawn before anything runs.
GENERATE = """
import os
import mutmut.__main__ as mm
mm.set_mutant_under_test("mutant_generation")
os.makedirs("mutants", exist_ok=True)
mm.copy_src_dir(); mm.copy_also_copy_files(); mm.setup_source_paths(); mm.store_lines_covered_by_tests()
mm.create_mutants(os.cpu_count() or 2)
"""


def summarise(results: str) -> dict[str, Counter[str]]:
    """Per module, a count of mutant statuses, from `mutmut results --all true`."""
    by_module: dict[str, Counter[str]] = defaultdict(Counter)
    for line in results.splitlines():
        found = LINE.match(line)
        if found:
            by_module[found.group(1)][found.group(2)] += 1
    return dict(by_module)


def statuses(results: str) -> dict[str, tuple[str, str]]:
    """Each mutant's (module, status), from `mutmut results --all true`."""
    found = (NAME.match(line) for line in results.splitlines())
    return {m.group(1): (m.group(2), m.group(3)) for m in found if m}


def draw(names: dict[str, tuple[str, str]], patterns: list[str], size: int, seed: int) -> list[str]:
    """The first `size` names of each module matching `patterns`, shuffled by a seed of its own per module."""
    by_module: dict[str, list[str]] = defaultdict(list)
    for name, (module, _) in names.items():
        if not patterns or any(fnmatch.fnmatch(name, p) for p in patterns):
            by_module[module].append(name)
    sample: list[str] = []
    for module, members in sorted(by_module.items()):
        shuffled = sorted(members)
        random.Random(f"{seed}:{module}").shuffle(shuffled)
        sample += shuffled[:size]
    return sample


def wilson(killed: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95% Wilson score interval of a share killed/n (holds near 0 and 1, unlike p ± 1.96 SE)."""
    if n == 0:
        return 0.0, 1.0
    p = killed / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def sample_table(names: dict[str, tuple[str, str]], sample: list[str]) -> list[str]:
    """Per module: sampled, killed, score with its interval, then the sample's survivors by name."""
    by_module: dict[str, list[str]] = defaultdict(list)
    for name in sample:
        by_module[names[name][0]].append(name)
    lines = [f"{'module':<34} {'sampled':>7} {'killed':>6} {'score':>6}  95% interval  not run"]
    survivors = []
    for module, members in sorted(by_module.items()):
        status = [names[n][1] for n in members]
        run = [s for s in status if s not in NOT_RUN]
        killed = sum(s in KILLED for s in run)
        low, high = wilson(killed, len(run))
        score = f"{100 * killed / len(run):.0f}%" if run else "-"
        lines.append(f"{module:<34} {len(run):>7} {killed:>6} {score:>6}  {100 * low:3.0f}%-{100 * high:3.0f}%"
                     f"  {len(status) - len(run):>7}")
        survivors += [f"  {n}: {names[n][1]}" for n in members if names[n][1] not in KILLED | NOT_RUN]
    return lines + (["survivors:", *survivors] if survivors else [])


def mutmut_results() -> str:
    return subprocess.run([sys.executable, "-m", "mutmut", "results", "--all", "true"], cwd=REPO,
                          capture_output=True, text=True, check=True).stdout


def table(by_module: dict[str, Counter[str]]) -> list[str]:
    lines = [f"{'module':<28} {'killed':>7} {'checked':>8} {'score':>6}  survivors"]
    for module, counts in sorted(by_module.items()):
        checked = sum(n for s, n in counts.items() if s not in NOT_RUN)
        killed = sum(n for s, n in counts.items() if s in KILLED)
        others = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()) if s not in KILLED and s not in NOT_RUN)
        score = f"{100 * killed / checked:.0f}%" if checked else "-"
        lines.append(f"{module:<28} {killed:>7} {checked:>8} {score:>6}  {others}")
    return lines


def markdown(by_module: dict[str, Counter[str]]) -> list[str]:
    lines = ["| module | mutants run | killed (timeouts) | score | survived | no unit test reaches | not run |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for module, counts in sorted(by_module.items()):
        checked = sum(n for s, n in counts.items() if s not in NOT_RUN)
        killed = sum(n for s, n in counts.items() if s in KILLED)
        score = f"{100 * killed / checked:.0f}%" if checked else "-"
        lines.append(f"| `{module.replace('.', '/')}.py` | {checked} | {killed} ({counts['timeout']}) | {score} | "
                     f"{counts['survived']} | {counts['no tests']} | {sum(counts[s] for s in NOT_RUN)} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mutants", nargs="*", help="mutant name globs, e.g. 'transforms.model.prompt*' (default: all)")
    ap.add_argument("--summary-only", action="store_true", help="print the table of the last run")
    ap.add_argument("--markdown", action="store_true", help="the table as Markdown (for docs/development.md)")
    ap.add_argument("--max-children", type=int, default=0, help="mutmut's parallel test processes (0: its default)")
    ap.add_argument("--sample", type=int, default=0, help="score a random sample of N mutants per module")
    ap.add_argument("--seed", type=int, default=0, help="the sample's seed (with --sample)")
    args = ap.parse_args(argv)
    to_run = args.mutants
    if args.sample > 0:
        if not statuses(mutmut_results()):
            subprocess.run([sys.executable, "-c", GENERATE], cwd=REPO, check=True, capture_output=True)
        names = statuses(mutmut_results())
        sample = draw(names, args.mutants, args.sample, args.seed)
        # mutmut runs a named mutant again even when it has a result: name only those without one.
        to_run = [n for n in sample if names[n][1] in NOT_RUN]
    if not args.summary_only and (to_run or not args.sample):
        children = ["--max-children", str(args.max_children)] if args.max_children > 0 else []
        # mutmut runs the tests from mutants/, one folder deeper: point them at the corpus beside the repository.
        env = {"PAGEMILL_CORPUS": str(REPO.parent / "shared" / "corpus"), **os.environ}
        # The editable install maps `pipelines`/`transforms` to the checkout's own sources: a test's child process
        # (a killed run, a CLI call) would import those, unmutated. mutants/ first on its path too.
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO / "mutants"), env.get("PYTHONPATH")) if p)
        # A mutant that breaks the engine service makes its tests wait on answers, not use CPU, so mutmut's
        # CPU-time limit is slow to stop them: a hung test fails (the mutant is killed) after 60 s.
        env["PYTEST_ADDOPTS"] = f"{env.get('PYTEST_ADDOPTS', '')} --timeout=60".strip()
        run = subprocess.run([sys.executable, "-m", "mutmut", "run", *children, *to_run], cwd=REPO, env=env,
                             check=False)
        if run.returncode != 0:
            return run.returncode
    results = mutmut_results()
    if args.sample > 0:
        print("\n".join(sample_table(statuses(results), sample)))
        return 0
    by_module = summarise(results)
    print("\n".join(markdown(by_module) if args.markdown else table(by_module)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
