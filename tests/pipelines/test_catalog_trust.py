"""Issue 42 row 2: a catalog's answers are data, not code. A REST catalog server (a stdlib one, in a thread) whose
`/v1/config` names a class for pyiceberg to import and call, and a SQL catalog table whose properties do, make
`pagemill sql` and `pagemill run` exit 2 with the reason, and the class never runs. A token or credential is not
sent to a non-loopback catalog over plain http unless the user says so."""
from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from pipelines import cli
from tests.support import catalog_marker, docmaker
from transforms.store import iceberg

pytest.importorskip("pyiceberg")

MARKER = "tests.support.catalog_marker.Planted"
RENDER_ONLY = ["--extract", "false", "--nsfw-classifier", "none", "--hints", "none", "--workers", "1",
               "--progress-every-s", "0"]


@pytest.fixture
def hostile_server() -> Iterator[tuple[str, list[str], dict[str, str]]]:
    """A REST catalog whose config answer is set by the test; the paths it was asked for."""
    asked: list[str] = []
    overrides: dict[str, str] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            body = json.dumps({"defaults": {}, "overrides": overrides}).encode() if self.path.startswith(
                "/v1/config") else b'{"error": {"message": "no", "type": "NoSuchTableException", "code": 404}}'
            self.send_response(200 if self.path.startswith("/v1/config") else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_POST = do_HEAD = do_GET

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", asked, overrides
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.mark.parametrize(("key", "value"), [("py-io-impl", MARKER), ("py-io-impl", "subprocess.Popen"),
                                            ("s3.retry-strategy-impl", MARKER)])
def test_a_catalog_server_that_names_a_class_makes_pagemill_sql_exit_2_and_nothing_runs(
        hostile_server, tmp_path: Path, capsys: pytest.CaptureFixture[str], key: str, value: str) -> None:
    url, asked, overrides = hostile_server
    overrides[key] = value
    catalog_marker.CALLS.clear()
    code = cli.main(["sql", "--output", str(tmp_path), "--catalog", url, "SELECT count(*) FROM pages"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"{key}={value}" in err and "/v1/config" in err
    assert catalog_marker.CALLS == []
    assert [p.split("?")[0] for p in asked] == ["/v1/config"]  # refused before anything else was asked


def test_a_catalog_server_that_names_a_class_makes_pagemill_run_exit_2_before_any_work(
        hostile_server, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url, _, overrides = hostile_server
    overrides["py-io-impl"] = MARKER
    catalog_marker.CALLS.clear()
    docmaker.pdf_folder(tmp_path / "in", 1)
    code = cli.main(["run", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"), "--run-id", "r",
                     "--catalog", url, *RENDER_ONLY])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"py-io-impl={MARKER}" in err
    assert catalog_marker.CALLS == []
    assert not list((tmp_path / "out").glob("documents/**/*.parquet"))  # refused before the pipeline


@pytest.mark.parametrize("key", ["py-io-impl", "write.py-location-provider.impl"])
def test_a_table_whose_properties_name_a_class_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          key: str) -> None:
    """A SQL catalog's table metadata (a file in the warehouse, written by whoever can write there) naming its
    own FileIO or location provider (which pyiceberg would make at the next commit)."""
    catalog = iceberg.open_catalog(iceberg.CatalogConfig(uri=iceberg.EMBEDDED), str(tmp_path))
    tbl = iceberg.table_for(catalog, "pagemill", "pages")
    metadata = Path(tbl.metadata_location.removeprefix("file://"))
    written = json.loads(metadata.read_text())
    written.setdefault("properties", {})[key] = MARKER
    metadata.write_text(json.dumps(written))
    catalog_marker.CALLS.clear()
    code = cli.main(["sql", "--output", str(tmp_path), "--catalog", "sqlite", "SELECT count(*) FROM pages"])
    assert code == 2
    assert f"{key}={MARKER}" in capsys.readouterr().err
    with pytest.raises(iceberg.CatalogRefused):  # a run's commit loads the table first
        iceberg.table_for(catalog, "pagemill", "pages")
    assert catalog_marker.CALLS == []


@pytest.mark.parametrize(("uri", "properties", "allow", "refused"), [
    ("http://catalog.example/api", ["token=t"], False, True),
    ("http://catalog.example/api", ["credential=id:secret"], False, True),
    ("http://catalog.example/api", ["header.Authorization=Bearer t"], False, True),
    ("http://user:pw@catalog.example/api", [], False, True),
    ("http://catalog.example/api", ["token=t"], True, False),
    ("http://catalog.example/api", ["warehouse=prod"], False, False),
    ("http://127.0.0.1:8181", ["token=t"], False, False),
    ("http://[::1]:8181", ["token=t"], False, False),
    ("https://catalog.example/api", ["token=t"], False, False)])
def test_a_credential_goes_to_a_remote_plain_http_catalog_only_when_allowed(
        uri: str, properties: list[str], allow: bool, refused: bool) -> None:
    from transforms.store.catalog import catalog_problems

    problems = catalog_problems(uri, "s3://b/o", properties, allow_http=allow)
    assert bool(problems) is refused
    assert all("pw" not in p for p in problems)


def test_pagemill_sql_refuses_a_token_over_plain_http_with_exit_2(capsys: pytest.CaptureFixture[str],
                                                                   tmp_path: Path) -> None:
    code = cli.main(["sql", "--output", str(tmp_path), "--catalog", "http://192.0.2.1/api", "--catalog-property",
                     "token=t0ken", "SELECT 1"])
    err = capsys.readouterr().err
    assert code == 2 and "--catalog-allow-http" in err and "t0ken" not in err


@pytest.mark.parametrize(("props", "refused"), [
    ({"py-io-impl": "pyiceberg.io.pyarrow.PyArrowFileIO"}, False),
    ({"py-io-impl": "pyiceberg.io.fsspec.FsspecFileIO"}, False),
    ({"io-impl": "org.apache.iceberg.aws.s3.S3FileIO"}, False),  # Java's, for Java clients: never imported here
    ({"py-io-impl": "os.system"}, True), ({"py-catalog-impl": MARKER}, True),
    ({"auth": {"type": "custom", "impl": MARKER}}, True), ({"warehouse": "s3://w"}, False)])
def test_code_problems(props: dict, refused: bool) -> None:
    from transforms.store.catalog import code_problems

    assert bool(code_problems(props, "x")) is refused
