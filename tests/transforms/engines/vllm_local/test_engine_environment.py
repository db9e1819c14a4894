"""The engine's environment (transforms/engines/vllm_local/vllm_args.py engine_environment): explicit, computed from
the settings, set once by the engine's constructor, before the engine exists (it starts on first use), never mid-run."""
from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

from transforms.engines.vllm_local.engine import VllmLocalEngine
from transforms.engines.vllm_local.settings import VllmLocalSettings
from transforms.engines.vllm_local.vllm_args import ONEDNN_CACHE_CAPACITY, engine_environment

SETTINGS = VllmLocalSettings(model="org/model", model_revision=None, max_model_len=8192, max_num_seqs=4,
                          gpu_memory_utilization=0.9, tensor_parallel_size=1, limit_mm_per_prompt=1,
                          kv_cache_gib=None, enforce_eager=False)


def test_in_process_switch_follows_the_option_and_the_platform() -> None:
    assert engine_environment(SETTINGS, cpu=True, environ={})["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert engine_environment(SETTINGS, cpu=False, environ={})["VLLM_ENABLE_V1_MULTIPROCESSING"] == "1"
    forced = replace(SETTINGS, in_process=True)
    assert engine_environment(forced, cpu=False, environ={})["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    # The option wins over a value already there.
    assert engine_environment(forced, cpu=False, environ={"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}) == \
        {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def test_onednn_cache_on_a_cpu_and_offline_hub_for_a_folder_unless_set(tmp_path: Path) -> None:
    local = replace(SETTINGS, model=str(tmp_path))
    env = engine_environment(local, cpu=True, environ={})
    assert env == {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "HF_HUB_OFFLINE": "1",
                   "ONEDNN_PRIMITIVE_CACHE_CAPACITY": str(ONEDNN_CACHE_CAPACITY)}
    assert "ONEDNN_PRIMITIVE_CACHE_CAPACITY" not in engine_environment(local, cpu=False, environ={})
    assert "HF_HUB_OFFLINE" not in engine_environment(SETTINGS, cpu=True, environ={})  # a hub id
    caller = {"HF_HUB_OFFLINE": "0", "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "0", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    assert engine_environment(local, cpu=True, environ=caller) == {}  # the caller's values stay; nothing to set


def test_making_an_engine_sets_its_environment_before_it_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("vllm")
    from transforms.engines.vllm_local.vllm_args import is_cpu_platform

    wrong = "1" if is_cpu_platform() else "0"  # the opposite of what the default settings need
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", wrong)
    # Recorded as absent first, so that what the engine sets is removed after the test.
    monkeypatch.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "")
    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY")
    engine = VllmLocalEngine(SETTINGS)
    assert engine.llm is None  # not started: the environment is set before the engine exists
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] != wrong
    assert engine_environment(SETTINGS, is_cpu_platform(), os.environ) == {}


def test_every_engine_caches_the_shared_prompt_and_no_page_image() -> None:
    """docs/extraction.md's engine settings for every preset: the prefix cache on (the system prompt and the schema
    are computed once a run), the multi-modal processor cache off (a page reaches the engine once per key)."""
    from transforms.engines.vllm_local.vllm_args import engine_kwargs

    for cpu in (True, False):
        kwargs = engine_kwargs(SETTINGS, cpu)
        assert (kwargs["enable_prefix_caching"], kwargs["mm_processor_cache_gb"]) == (True, 0), cpu
