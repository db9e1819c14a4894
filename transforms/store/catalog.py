"""Which Iceberg catalog `--catalog` names, and opening it so that its answers stay data (transforms/store/iceberg.py
commits to it and reads from it).

pyiceberg imports and calls whatever class a property names (`py-io-impl`, `py-catalog-impl`, a table's
`write.py-location-provider.impl`, `s3.retry-strategy-impl`, a custom `auth` impl), and a REST catalog's
`/v1/config` answer and a table's metadata are merged into those properties: a hostile or compromised catalog
server could make pagemill run its code. The catalog classes here check every property set before pyiceberg
uses it: a FileIO must be pyiceberg's own (`ALLOWED_IO`), any other class name is refused (`CatalogRefused`,
exit 2). A credential is never sent to a non-loopback catalog over plain `http://` unless the user says so
(`--catalog-allow-http`).
"""
from __future__ import annotations

import logging
import os
import random
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any
from urllib.parse import urlsplit

from schemas import layout
from transforms.text_safety import is_loopback

log = logging.getLogger(__name__)

DEFAULT_NAMESPACE = "pagemill"
# A SQL catalog keys its tables by the catalog's name too: a reader opens it under this name.
CATALOG_NAME = "pagemill"
# `--catalog sqlite`: an embedded SQL catalog in a file under a local output root (nothing to start).
EMBEDDED = "sqlite"
EMBEDDED_FILE = "catalog.db"
WAREHOUSE = "iceberg"  # where the catalog writes its metadata files, under the output root
COMMIT_ATTEMPTS = 20
NAMESPACE = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,127}")
ALLOWED_IO = ("pyiceberg.io.pyarrow.PyArrowFileIO", "pyiceberg.io.fsspec.FsspecFileIO")
# Properties whose value pyiceberg imports and calls (a `py-...impl` of a later release too). Java's `io-impl`,
# which REST servers send for Java clients, pyiceberg never imports: it is left alone.
IMPORTED = re.compile(r"(^|\.)py-[\w.-]*impl$|^s3\.retry-strategy-impl$|^impl$")
ALLOW_HTTP_FLAG = "--catalog-allow-http"


class CatalogRefused(ValueError):
    """A catalog (its server's answer, a table's properties) asked for something pagemill will not do."""


@dataclass(frozen=True)
class CatalogConfig:
    """Which catalog, which namespace, and the catalog's extra properties (a REST catalog's token, ...)."""

    uri: str
    namespace: str = DEFAULT_NAMESPACE
    properties: tuple[tuple[str, str], ...] = ()


def catalog_config(uri: str | None, namespace: str | None = None,
                   properties: Sequence[str] | None = None) -> CatalogConfig | None:
    """Pure: the options' catalog (None without `--catalog`); `properties` are `KEY=VALUE` strings."""
    if not uri:
        return None
    pairs = tuple(tuple(p.split("=", 1)) for p in properties or () if "=" in p[1:])
    return CatalogConfig(uri=uri, namespace=namespace or DEFAULT_NAMESPACE, properties=pairs)  # type: ignore[arg-type]


def catalog_problems(uri: str | None, output: str, properties: Sequence[str] = (),
                     namespace: str | None = None, allow_http: bool = False) -> list[str]:
    """Pure: why `--catalog URI` (with `--catalog-property KEY=VALUE`s, `--catalog-namespace`,
    `--catalog-allow-http`) cannot be used with `output`."""
    if not uri:
        return []
    problems = [f"--catalog-property {p!r}: expected KEY=VALUE" for p in properties if "=" not in p[1:]]
    if namespace is not None and not NAMESPACE.fullmatch(namespace):
        problems.append(f"--catalog-namespace {namespace!r}: letters, digits and '_', starting with a letter")
    pairs = dict(p.split("=", 1) for p in properties if "=" in p[1:])
    problems += code_problems(pairs, "--catalog-property")
    if uri == EMBEDDED:
        if "://" in output and not output.startswith("file://"):
            problems.append(f"--catalog {EMBEDDED}: the embedded catalog is a file under a local output root, and "
                            f"--output {output} is object storage; give a catalog URI (postgresql://..., "
                            "https://... for a REST catalog)")
        return problems
    scheme = uri.split("://", 1)[0] if "://" in uri else ""
    if not scheme:
        problems.append(f"--catalog {uri!r}: expected '{EMBEDDED}', a SQLAlchemy URI (sqlite:///FILE, "
                        "postgresql+psycopg2://...) or a REST catalog's http(s):// URI")
    plain = None if allow_http else plain_http_problem(uri, pairs)
    return problems + ([plain] if plain else [])


def plain_http_problem(uri: str, properties: Mapping[str, str]) -> str | None:
    """Pure: why a credential would go over plain http to another machine, or None (https, loopback, or nothing
    secret sent). What pyiceberg's REST client sends: `token` (a bearer header), `credential` (to the token
    endpoint), `header.*` and `auth*` properties, and a user:password in the URI."""
    parts = urlsplit(uri)
    if parts.scheme != "http" or is_loopback(parts.hostname or ""):
        return None
    sent = sorted(k for k in properties if k in ("token", "credential") or k.startswith(("header.", "auth")))
    if parts.username or parts.password:
        sent.append("the URI's user:password")
    if not sent:
        return None
    from transforms.text_safety import redact_url

    return (f"--catalog {redact_url(uri)}: plain http to {parts.hostname} would send {', '.join(sent)} unencrypted "
            f"to the network; use https://, or say {ALLOW_HTTP_FLAG} if the network is private")




def code_problems(properties: Mapping[str, Any], where: str) -> list[str]:
    """Pure: the properties that would make pyiceberg import and call a class other than its own FileIOs."""
    found = []
    for key, value in properties.items():
        if isinstance(value, Mapping):  # a nested `auth` block: its `impl`
            found += code_problems({f"{key}.{k}": v for k, v in value.items()}, where)
        elif key == "py-io-impl" and value in ALLOWED_IO:
            continue
        elif IMPORTED.search(key) or (key.endswith(".impl") and key.startswith("auth.")):
            allowed = f" (allowed: {', '.join(ALLOWED_IO)})" if key == "py-io-impl" else ""
            found.append(f"{where} {key}={value!s:.80}: pagemill runs no class a catalog or property names{allowed}")
    return found


def refuse_code(properties: Mapping[str, Any], where: str) -> None:
    problems = code_problems(properties, where)
    if problems:
        raise CatalogRefused(problems[0])


def catalog_kind(uri: str) -> str:
    """Pure: pyiceberg's catalog type for a URI: `rest` for http(s), else `sql` (any SQLAlchemy URI)."""
    return "rest" if uri.startswith(("http://", "https://")) else "sql"


def is_local(output: str) -> bool:
    return "://" not in output or output.startswith("file://")


def data_path(path: str) -> str:
    """Pure: a part file's path as the catalog records it: absolute for a local file, the URI otherwise."""
    return os.path.abspath(path.removeprefix("file://")) if is_local(path) else path


def catalog_properties(config: CatalogConfig, output: str, storage: Any = None) -> dict[str, str]:
    """Pure: pyiceberg's properties for the catalog: its URI, the warehouse under the output root (metadata files
    only: data files stay where pagemill wrote them), and S3 settings for object storage."""
    uri = config.uri
    if uri == EMBEDDED:
        uri = f"sqlite:///{data_path(layout.join_uri(output, EMBEDDED_FILE))}"
    root = data_path(output)
    warehouse = f"file://{layout.join_uri(root, WAREHOUSE)}" if is_local(output) else layout.join_uri(root, WAREHOUSE)
    props = {"uri": uri, "warehouse": warehouse}
    if storage is not None:
        for key, value in (("s3.endpoint", storage.s3_endpoint_url), ("s3.region", storage.s3_region),
                           ("s3.access-key-id", storage.s3_access_key_id),
                           ("s3.secret-access-key", storage.s3_secret_access_key),
                           ("s3.session-token", storage.s3_session_token)):
            if value:
                props[key] = value
    props.update(dict(config.properties))  # the user's word wins (a REST catalog's own warehouse, say)
    return props


@cache
def catalog_class(kind: str) -> type:
    """pyiceberg's SQL or REST catalog, with every property set checked (`refuse_code`) before pyiceberg uses it:
    the catalog's own, a REST server's `/v1/config` answer (before its first authenticated session), and each
    table's (before its FileIO is made)."""
    from pyiceberg.catalog.rest import RestCatalog
    from pyiceberg.catalog.sql import SqlCatalog

    base: Any = RestCatalog if kind == "rest" else SqlCatalog

    class Checked(base):  # type: ignore[misc, valid-type]
        def __init__(self, name: str, **properties: str) -> None:
            refuse_code(properties, "the catalog's property")
            super().__init__(name, **properties)

        def _fetch_config(self) -> None:  # RestCatalog only: the server's answer, merged into the properties
            super()._fetch_config()
            refuse_code(self.properties, "the catalog server's /v1/config answer:")

        def _load_file_io(self, properties: Any = None, location: str | None = None) -> Any:
            refuse_code({**self.properties, **(properties or {})}, "a table's property")
            return super()._load_file_io(properties or {}, location)

    Checked.__name__ = Checked.__qualname__ = f"Checked{base.__name__}"
    return Checked


def open_catalog(config: CatalogConfig, output: str, storage: Any = None, create: bool = True) -> Any:
    """The catalog; with `create` (a run), the embedded catalog's file and the namespace are made when missing.
    A reader (`create=False`) makes nothing: a missing embedded catalog is a ValueError that says so. A catalog
    that names a class to run raises CatalogRefused."""
    if config.uri == EMBEDDED and is_local(output):
        if create:
            os.makedirs(data_path(output), exist_ok=True)
        elif not os.path.exists(data_path(layout.join_uri(output, EMBEDDED_FILE))):
            raise ValueError(f"--catalog {EMBEDDED}: no catalog under {output} (a run with --catalog makes it)")
    props = catalog_properties(config, output, storage)
    kind = catalog_kind(props["uri"])
    # A SQL catalog makes its own tables when it opens a new database: two runs opening it at once race there too.
    catalog = made_once(lambda: catalog_class(kind)(CATALOG_NAME, **props), "the catalog's tables")
    if create:
        # Two runs opening a new catalog at once both may make the namespace.
        made_once(lambda: catalog.create_namespace_if_not_exists(config.namespace), f"namespace {config.namespace}")
    return catalog


def backoff_s(attempt: int) -> float:
    """How long a writer that lost a race waits before its next attempt: doubling from 50 ms to 2 s, jittered."""
    return min(2.0, 0.05 * 2 ** attempt) * (0.5 + random.random())


def made_once(make: Any, what: str) -> Any:
    """`make()` (an if-not-exists creation), tolerant of a lost race: two writers that both see a thing missing
    both insert it, and the SQL catalog fails the second (IntegrityError, or SQLite's `database is locked`)
    where an if-not-exists call should have found it made. Trying again finds it."""
    for attempt in range(COMMIT_ATTEMPTS):
        try:
            return make()
        except sql_lost_race() as err:
            log.info("iceberg: making %s retried (%s)", what, type(err).__name__)
            time.sleep(backoff_s(attempt))
    raise RuntimeError(f"iceberg: {what} could not be made after {COMMIT_ATTEMPTS} attempts")


def sql_busy() -> type[BaseException]:
    """SQLite's `database is locked` under two writers: a lost race like any other."""
    try:
        from sqlalchemy.exc import OperationalError
    except ImportError:  # pragma: no cover - a REST-only install
        return CommitRetry
    return OperationalError


def sql_lost_race() -> tuple[type[BaseException], ...]:
    """What a SQL catalog raises to the second of two writers inserting the same row."""
    try:
        from sqlalchemy.exc import IntegrityError
    except ImportError:  # pragma: no cover - a REST-only install
        return (CommitRetry,)
    return (IntegrityError, sql_busy())


class CommitRetry(Exception):
    """Placeholder for a catalog kind without a busy error of its own."""
