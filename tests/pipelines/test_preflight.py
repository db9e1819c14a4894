"""Pre-flight: each problem is one clear line and exit code 2, before any pipeline starts."""
from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from pipelines import cli
from tests.support import docmaker
from tests.support.served_faults import Injector, fault_server, own_address


@pytest.fixture()
def inputs(tmp_path: Path) -> Path:
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.png").write_bytes(docmaker.tiny_png())
    return folder


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = cli.main(["run", *args])
    return code, capsys.readouterr().err


def test_missing_input_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run(capsys, "--input", str(tmp_path / "nope"), "--output", str(tmp_path / "out"), "--extract", "false")
    assert code == 2 and f"input {tmp_path / 'nope'}: no such file or folder" in err


def test_output_that_cannot_be_written(inputs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("a file, not a folder")
    code, err = run(capsys, "--input", str(inputs), "--output", str(blocker / "out"), "--extract", "false")
    assert code == 2 and f"output {blocker / 'out'}: cannot write" in err


def test_bad_blocklist_line(inputs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.list"
    bad.write_text("# comment\nsha256:nothex\n")
    code, err = run(capsys, "--input", str(inputs), "--output", str(tmp_path / "out"), "--extract", "false",
                    "--blocklist", str(bad))
    assert code == 2 and "line 2" in err and "sha256:nothex" in err
    assert not (tmp_path / "out").exists()


def test_missing_local_model(inputs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run(capsys, "--input", str(inputs), "--output", str(tmp_path / "out"), "--model",
                    str(tmp_path / "no-model"))
    assert code == 2 and "no such model folder" in err


# --- a served endpoint (--engine openai): what it says is untrusted, what the URL holds is secret ----------------

ENDPOINT_FLAGS = ["--engine", "openai", "--model", "tiny", "--schema", "invoice"]
HOSTILE = "\x1b]0;pwned\x07\x1b[2J\x1b[31mred\r\u202eevil\u2066isolated\u2069\u200b\u061c"
SHOWN = "\\x1b]0;pwned\\x07\\x1b[2J\\x1b[31mred\\r\\u202eevil\\u2066isolated\\u2069\\u200b\\u061c"  # by hand


@pytest.mark.parametrize(("models", "says"), [
    ((500, HOSTILE.encode()), f"HTTP 500: {SHOWN}"),
    ((200, json.dumps({"data": [{"id": HOSTILE}]}).encode()),
     f"--model tiny: the endpoint does not serve it (it serves: {SHOWN})"),
])
def test_what_the_endpoint_says_is_printed_terminal_safe(inputs: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str],
                                                         models: tuple[int, bytes], says: str) -> None:
    with fault_server(Injector(models=models)) as url:
        code, err = run(capsys, "--input", str(inputs), "--output", str(tmp_path / "out"), "--endpoint", url,
                        *ENDPOINT_FLAGS)
    assert code == 2 and says in err, err
    assert not set(err) & set("\x1b\x07\r\u202e\u2066\u2069\u200b\u061c"), ascii(err)  # nothing raw


def test_a_huge_model_list_is_read_no_further(inputs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    big = json.dumps({"data": [{"id": f"m{i}"} for i in range(100_000)]}).encode()  # 1.6 MB
    with fault_server(Injector(models=(200, big))) as url:
        code, err = run(capsys, "--input", str(inputs), "--output", str(tmp_path / "out"), "--endpoint", url,
                        *ENDPOINT_FLAGS)
    assert code == 2 and "the answer is not an OpenAI model list (the answer is over 1 MiB)" in err, err


def test_the_password_in_an_endpoint_url_is_never_printed(inputs: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code, err = run(capsys, "--input", str(inputs), "--output", str(tmp_path / "out"), "--endpoint",
                    f"http://pagemill:s3cret-pw@127.0.0.1:{port}/v1", *ENDPOINT_FLAGS)
    assert code == 2 and f"--endpoint http://pagemill:***@127.0.0.1:{port}/v1/models: cannot reach" in err, err
    assert "s3cret" not in err


@pytest.mark.parametrize(("endpoint", "key", "warned"), [
    ("http://gpu-7:8000/v1", True, "the API key (--api-key-env)"),
    ("http://u:pw@gpu-7:8000/v1", False, "the URL's password"),
    ("http://u:pw@10.1.2.3/v1", True, "the API key (--api-key-env) and the URL's password"),
    ("http://gpu-7:8000/v1", False, None),  # nothing secret goes
    ("https://gpu-7:8000/v1", True, None),
    ("http://127.0.0.1:8000/v1", True, None),
    ("http://127.9.9.9:8000/v1", True, None),  # all of 127/8 is this machine
    ("http://[::1]:8000/v1", True, None),
    ("http://localhost:8000/v1", True, None),
    ("http://127.0.0.1.example.com/v1", True, "the API key (--api-key-env)"),  # a name, not the loopback
])
def test_which_endpoints_get_the_plain_http_warning(endpoint: str, key: bool, warned: str | None) -> None:
    from transforms.engines.openai.endpoint import plain_http_warning

    environ = {"PAGEMILL_TEST_KEY": "sk-test"} if key else {}
    line = plain_http_warning(endpoint, "PAGEMILL_TEST_KEY", environ)
    if warned is None:
        assert line is None
    else:
        assert line is not None and f": {warned} will go over plain http:// to " in line
        assert "pw" not in line.replace("--api-key-env", "") and "sk-test" not in line


def test_a_key_sent_over_plain_http_to_another_host_is_warned_about_once(
        inputs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAGEMILL_TEST_KEY", "sk-test-not-a-secret")
    host = own_address()  # this machine, but not through the loopback: the key crosses a network interface
    with fault_server(Injector(), host=host) as url:
        code, err = run(capsys, "--input", str(inputs), "--output", str(tmp_path / "out"), "--endpoint", url,
                        "--api-key-env", "PAGEMILL_TEST_KEY", *ENDPOINT_FLAGS, "--model", "not-served")
    assert code == 2 and "--model not-served: the endpoint does not serve it" in err  # stops after the warning
    warning = (f"pagemill: warning: --endpoint {url}: the API key (--api-key-env) will go over plain http:// "
               f"to {host}, readable on the network: use https://")
    assert err.count(warning) == 1 and err.count("warning") == 1, err
    assert "sk-test" not in err
