"""The runner recipes of docs/runners.md use flags that exist. The path distributed runners take (Beam's
PortableRunner with an external worker pool, the way Flink and Spark run Python SDK workers) is run end to end,
on a worker host of its own, by tests/pipelines/test_multihost.py."""
from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _recipes() -> list[list[str]]:
    """The `pagemill run` command lines of the Runners section of docs/runners.md, as argument lists."""
    import shlex

    text = (REPO / "docs" / "runners.md").read_text()
    section = text[text.index("## Runners\n"):]
    section = section[: section.index("\n## ", 5)].replace("\\\n", " ")
    found = []
    for line in section.splitlines():
        start = line.find("pagemill run ")
        if start < 0:
            continue
        command = line[start:].split("`")[0] if "`" in line[start:] else line[start:]
        args = [a for a in shlex.split(command)[2:] if a not in ("...", "…")]
        found.append(args)
    return found


def test_readme_runner_recipes_use_known_flags() -> None:
    """As far as a recipe can be tested here: every flag of the Dataflow, Flink and Spark lines parses."""
    from pipelines.config.options import check_flags

    recipes = _recipes()
    assert len(recipes) >= 4, recipes
    joined = " ".join(" ".join(r) for r in recipes)
    for runner in ("DataflowRunner", "FlinkRunner", "SparkRunner", "PortableRunner"):
        assert runner in joined
    for args in recipes:
        flags = [a for a in args if a != "--job" and not a.endswith(".yaml")]
        assert check_flags(flags) == [], args
