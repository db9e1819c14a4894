#!/usr/bin/env python
"""Mutation score of the stage modules that changed most (`make mutate`; not part of CI).

Runs mutmut (configured under [tool.mutmut] in pyproject.toml: transforms/extract/feed, engines/machine,
output/cache, document_work/timed, safety/gate and model/prompt; the waves and exactly-once modules
pipelines/run/waves and retries, store/compaction and progress, store/listing_file, pipelines/tables/typed_views
and export, extract/stage; each against its fast tests only), then prints,
per module, how many mutants the tests killed. A mutant that makes the tests time out counts as killed; one
that no test reaches ("no tests") counts as surviving.

    python scripts/mutate.py                               # every module (CPU heavy: nice it)
    python scripts/mutate.py "transforms.model.prompt*"    # one module
    python scripts/mutate.py "pipelines.run.retries*"      # one module under pipelines/
    python scripts/mutate.py --summary-only                # the table from the last run
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
KILLED = {"killed", "timeout", "caught by type check", "segfault"}
NOT_RUN = {"not checked", "skipped", "check was interrupted by user"}
# A mutant is `<module>.x_<function>__mutmut_<n>` or `<module>.xǁ<Class>ǁ<method>__mutmut_<n>`.
LINE = re.compile(r"^\s*((?:transforms|pipelines)(?:\.\w+)*?)\.x[_ǁ]\S*__mutmut_\d+: (.+?)\s*$")


def summarise(results: str) -> dict[str, Counter[str]]:
    """Per module, a count of mutant statuses, from `mutmut results --all true`."""
    by_module: dict[str, Counter[str]] = defaultdict(Counter)
    for line in results.splitlines():
        found = LINE.match(line)
        if found:
            by_module[found.group(1)][found.group(2)] += 1
    return dict(by_module)


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
    args = ap.parse_args(argv)
    if not args.summary_only:
        children = ["--max-children", str(args.max_children)] if args.max_children > 0 else []
        # mutmut runs the tests from mutants/, one folder deeper: point them at the corpus beside the repository.
        env = {"PAGEMILL_CORPUS": str(REPO.parent / "shared" / "corpus"), **os.environ}
        # The editable install maps `pipelines`/`transforms` to the checkout's own sources: a test's child process
        # (a killed run, a CLI call) would import those, unmutated. mutants/ first on its path too.
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO / "mutants"), env.get("PYTHONPATH")) if p)
        # A mutant that breaks the engine service makes its tests wait on answers, not use CPU, so mutmut's
        # CPU-time limit is slow to stop them: a hung test fails (the mutant is killed) after 60 s.
        env["PYTEST_ADDOPTS"] = f"{env.get('PYTEST_ADDOPTS', '')} --timeout=60".strip()
        run = subprocess.run([sys.executable, "-m", "mutmut", "run", *children, *args.mutants], cwd=REPO, env=env,
                             check=False)
        if run.returncode != 0:
            return run.returncode
    results = subprocess.run([sys.executable, "-m", "mutmut", "results", "--all", "true"], cwd=REPO,
                             capture_output=True, text=True, check=True).stdout
    by_module = summarise(results)
    print("\n".join(markdown(by_module) if args.markdown else table(by_module)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
