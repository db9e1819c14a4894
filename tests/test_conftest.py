"""The CI strictness of tests/conftest.py, checked on a small suite in a subprocess: with `CI` set a skip
outside tests/gpu/ fails the run, whether it is made in a test, a fixture, a skipif mark or at import time
(`pytest.importorskip`); tests/gpu/ may still skip. Without `CI` the same suite passes with skips."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import tests.conftest as conftest

SUITE = {
    "test_ok.py": "def test_ok():\n    assert True\n",
    "test_skip_call.py": "import pytest\n\ndef test_s():\n    pytest.skip('no tool here')\n",
    "test_skip_mark.py": ("import pytest\nfrom tests.conftest import CORPUS\n\n"
                          "@pytest.mark.skipif(not CORPUS.is_dir(), reason='corpus is absent')\n"
                          "def test_m():\n    assert CORPUS.is_dir()\n"),
    "test_skip_fixture.py": ("import pytest\n\n@pytest.fixture\ndef f():\n    pytest.skip('fixture skip')\n\n"
                             "def test_f(f):\n    pass\n"),
    "test_skip_import.py": ("import pytest\n\npytest.importorskip('no_such_module_anywhere')\n\n"
                            "def test_i():\n    pass\n"),
    "test_xfail.py": "import pytest\n\n@pytest.mark.xfail(reason='known')\ndef test_x():\n    assert False\n",
    "gpu/test_gpu.py": ("import pytest\n\n@pytest.mark.skipif(True, reason='no CUDA GPU')\n"
                        "def test_g():\n    pass\n"),
}


def run_suite(tmp_path: Path, files: dict[str, str], ci: str | None, corpus: Path | None = None,
              args: tuple[str, ...] = ()) -> tuple[int, str]:
    tests = tmp_path / "tests"
    (tests / "gpu").mkdir(parents=True, exist_ok=True)
    shutil.copy(conftest.__file__, tests / "conftest.py")
    (tests / "__init__.py").write_text("")
    for name, text in files.items():
        (tests / name).write_text(text)
    # Not the outer run's CI, corpus or xdist worker (when `make test` runs this on a worker).
    env = {k: v for k, v in os.environ.items()
           if k not in ("CI", "PAGEMILL_CORPUS") and not k.startswith("PYTEST_XDIST")}
    if ci is not None:
        env["CI"] = ci
    if corpus is not None:
        env["PAGEMILL_CORPUS"] = str(corpus)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA", *args, "tests"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False)
    return proc.returncode, proc.stdout + proc.stderr


def test_without_ci_skips_are_skips(tmp_path: Path) -> None:
    files = {k: v for k, v in SUITE.items() if k != "test_skip_import.py"}
    code, out = run_suite(tmp_path, files, ci=None, corpus=tmp_path / "missing")
    assert code == 0, out
    assert "4 skipped" in out and "1 xfailed" in out, out


# `make test` runs two xdist workers: the hooks must hold there too (the workers make the reports).
@pytest.mark.parametrize("args", [(), ("-n", "2", "--dist", "loadfile")], ids=["serial", "xdist"])
def test_with_ci_every_skip_outside_gpu_fails(tmp_path: Path, args: tuple[str, ...]) -> None:
    files = {k: v for k, v in SUITE.items() if k != "test_skip_import.py"}
    code, out = run_suite(tmp_path, files, ci="true", corpus=tmp_path / "missing", args=args)
    assert code == 1, out
    for test in ("test_skip_call.py::test_s", "test_skip_mark.py::test_m", "test_skip_fixture.py::test_f"):
        assert f"FAILED tests/{test}" in out or f"ERROR tests/{test}" in out, out
    assert "corpus is absent" in out and "skips outside tests/gpu/ fail under CI" in out
    assert "SKIPPED [1] tests/gpu/test_gpu.py" in out, out  # the GPU folder may still skip
    assert "1 xfailed" in out, out  # an expected failure is not a skip


def test_with_ci_an_import_time_skip_fails_collection(tmp_path: Path) -> None:
    code, out = run_suite(tmp_path, {"test_ok.py": SUITE["test_ok.py"],
                                     "test_skip_import.py": SUITE["test_skip_import.py"]}, ci="1")
    assert code != 0, out
    assert "no_such_module_anywhere" in out and "skips outside tests/gpu/ fail under CI" in out, out


# A make that takes a while: the other worker asks while it runs.
MADE_ONCE = ("import os\nimport time\nfrom tests.conftest import made_once\n\n"
             "def make(folder):\n"
             "    with open(os.environ['MADE_LOG'], 'a') as log:\n"
             "        log.write(os.environ.get('PYTEST_XDIST_WORKER', 'main') + '\\n')\n"
             "    time.sleep(2)\n"
             "    (folder / 'made.txt').write_text('x')\n\n"
             "def test_{n}(tmp_path_factory):\n"
             "    folder = made_once(tmp_path_factory, 'shared', make)\n"
             "    assert (folder / 'made.txt').read_text() == 'x'\n"
             "    with open(os.environ['SEEN_LOG'], 'a') as log:\n"
             "        log.write(os.environ['PYTEST_XDIST_WORKER'] + ' ' + str(folder) + '\\n')\n")


def test_made_once_makes_a_folder_once_for_every_worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made, seen = tmp_path / "made.log", tmp_path / "seen.log"
    monkeypatch.setenv("MADE_LOG", str(made))
    monkeypatch.setenv("SEEN_LOG", str(seen))
    files = {f"test_made_{n}.py": MADE_ONCE.format(n=n) for n in range(4)}
    code, out = run_suite(tmp_path, files, ci=None, args=("-n", "2", "--dist", "loadfile"))
    assert code == 0 and "4 passed" in out, out
    assert len(made.read_text().splitlines()) == 1  # made by one worker; the others waited and reused it
    seen_by = [line.split(" ", 1) for line in seen.read_text().splitlines()]
    assert len(seen_by) == 4 and {w for w, _ in seen_by} == {"gw0", "gw1"}, seen_by  # both workers asked
    assert len({folder for _, folder in seen_by}) == 1, seen_by  # and got the one folder


def test_with_ci_and_the_corpus_present_the_corpus_test_runs(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    code, out = run_suite(tmp_path, {"test_skip_mark.py": SUITE["test_skip_mark.py"]}, ci="true", corpus=corpus)
    assert code == 0 and "1 passed" in out, out


def test_the_corpus_is_found_beside_the_repository(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PAGEMILL_CORPUS", raising=False)
    assert conftest.corpus_dir() == Path(conftest.__file__).resolve().parents[2] / "shared" / "corpus"
    monkeypatch.setenv("PAGEMILL_CORPUS", "/elsewhere/corpus")
    assert conftest.corpus_dir() == Path("/elsewhere/corpus")


def test_vllm_not_installed_is_false_and_broken_raises(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(conftest.importlib.util, "find_spec", lambda name: None)
    assert conftest.vllm_available() is False
    monkeypatch.undo()
    broken = tmp_path / "broken"
    (broken / "vllm").mkdir(parents=True)
    (broken / "vllm" / "__init__.py").write_text("import torch_that_is_missing_here\n")
    monkeypatch.syspath_prepend(str(broken))
    saved = sys.modules.pop("vllm", None)
    try:
        with pytest.raises(RuntimeError, match="vLLM is installed but does not import: ModuleNotFoundError"):
            conftest.vllm_available()
    finally:
        sys.modules.pop("vllm", None)
        if saved is not None:
            sys.modules["vllm"] = saved
