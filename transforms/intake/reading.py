"""Reading one input object, capped at --max-bytes + 1, with retries that are stated rather than inherited.

An `s3://` object is read with one GetObject (a Range of limit + 1 bytes) through a boto3 client that each
DoFn instance builds once, configured here: botocore's `standard` retry mode with `--s3-max-attempts`
attempts in all (default 5). That mode retries 500/502/503/504, throttling (`SlowDown`, `Throttling`, ...)
and connection errors, with jittered exponential backoff (at most 20 s between attempts), and a body cut
off mid-stream is read again from the start, up to the same count. Beam's own S3 reader is not used for
inputs: its head-object and range reads retry on a fixed schedule of 7 retries from 5 s (ten minutes on one
object that keeps failing), which no option changes.

An object whose read still fails after the last attempt raises `ReadFailed` with reason `storage_error`
(a failure of the system: it counts towards exit code 1); any other refusal (no such key, access denied, a
local file that vanished) is `unreadable`, as before. Local paths are read with the OS's own calls, other
schemes (file://, gs://) through Beam's FileSystems.

A local file is opened before it is checked, and the check is on what was opened: a regular file (a FIFO
swapped in could block the read forever), and, when it lies in a folder the listing walked (`local_roots`),
one that resolves inside that folder. The listing already refuses a link leading out (`outside_input`); this
keeps a file swapped for such a link after the listing (or between intake and rendering) from being read
through it.

With `inputs` (this invocation's `--input` roots, transforms/intake/bounds.py), a URI that lies under none of
them is refused before anything is opened (`outside_input`): the run's listing is written under the output
root, where a tenant may write, so what it names is checked, never trusted.
"""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from schemas.reasons import OUTSIDE_INPUT, STORAGE_ERROR, UNREADABLE

# Error codes that say "slow down" rather than "no": botocore's standard mode retries these too.
THROTTLING = frozenset({"SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded",
                        "TooManyRequestsException", "RequestThrottled", "ProvisionedThroughputExceededException"})


class ReadFailed(Exception):
    """An object could not be read; carries the reason code for its row."""

    def __init__(self, reason_code: str, message: str) -> None:
        super().__init__(message)
        self.reason_code = reason_code


@dataclass(frozen=True)
class ReadConfig:
    """How workers read input objects. The keys are Beam's S3 options of this run (empty: boto3's own
    chain: environment, profile, instance role); never printed."""

    max_attempts: int = 5
    s3_endpoint_url: str | None = None
    s3_region: str | None = None
    s3_access_key_id: str | None = field(default=None, repr=False)
    s3_secret_access_key: str | None = field(default=None, repr=False)
    s3_session_token: str | None = field(default=None, repr=False)
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 60.0
    # (folder as listed, made absolute; the same folder resolved): a local object under one is read only if
    # what is opened resolves inside it (transforms/intake/listing.py local_roots)
    local_roots: tuple[tuple[str, str], ...] = ()
    # this invocation's --input roots: a URI under none of them is never read (None: not checked)
    inputs: Any = None  # transforms/intake/bounds.py InputRoots (not imported: bounds imports this room's listing)

    def botocore_config(self) -> Any:
        from botocore.config import Config

        # `total_max_attempts` counts the first attempt too (`max_attempts` in a Config counts retries only).
        return Config(retries={"mode": "standard", "total_max_attempts": max(1, self.max_attempts)},
                      connect_timeout=self.connect_timeout_s, read_timeout=self.read_timeout_s)


def read_capped(uri: str, limit: int) -> bytes:
    """Read at most limit + 1 bytes through Beam's FileSystems, so a listing that lied about the size
    cannot exhaust memory."""
    with FileSystems.open(uri, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        return handle.read(limit + 1)


def opened_path(fd: int, path: str) -> str:
    """Where an open file really is: the kernel's name for the descriptor (Linux), else the path resolved now."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return os.path.realpath(path)


def under(path: str, folder: str) -> bool:
    """Pure: `path` is `folder` or lies below it (both absolute, compared as they are)."""
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def read_local(path: str, limit: int, roots: tuple[tuple[str, str], ...] = ()) -> bytes:
    """At most limit + 1 bytes of a local file, checked after it is opened (see the module's docstring)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ReadFailed(UNREADABLE, "not a regular file (it changed after it was listed)")
        listed = os.path.abspath(path)
        for folder, real_folder in roots:
            if under(listed, folder) and not under(opened_path(fd, path), real_folder):
                raise ReadFailed(OUTSIDE_INPUT, "it became a link leading outside the listed folder after it was "
                                                "listed: not followed, not read")
        chunks, left = [], limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def is_storage_failure(err: Exception) -> bool:
    """Whether an error from boto3 is the store failing (5xx, throttling, the network) rather than a refusal."""
    from botocore import exceptions as x

    if isinstance(err, x.ClientError):
        status = err.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
        return status >= 500 or status == 429 or err.response.get("Error", {}).get("Code") in THROTTLING
    # The network: no connection, a timeout, a connection or body cut off. Not a bad parameter or no keys.
    return isinstance(err, x.ConnectionError | x.HTTPClientError | x.ResponseStreamingError | x.IncompleteReadError)


class ObjectReader:
    """Reads input objects for one DoFn instance; its S3 client is built on first use (not pickled)."""

    def __init__(self, cfg: ReadConfig) -> None:
        self.cfg = cfg
        self._client: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {"cfg": self.cfg, "_client": None}

    def client(self) -> Any:
        if self._client is None:
            import boto3

            c = self.cfg
            self._client = boto3.session.Session().client(
                "s3", endpoint_url=c.s3_endpoint_url, region_name=c.s3_region, aws_access_key_id=c.s3_access_key_id,
                aws_secret_access_key=c.s3_secret_access_key, aws_session_token=c.s3_session_token,
                config=c.botocore_config())
        return self._client

    def outside(self, uri: str) -> ReadFailed | None:
        """The refusal of a URI that lies under none of this run's --input roots, or None."""
        if self.cfg.inputs is None or self.cfg.inputs.admits(uri):
            return None
        return ReadFailed(OUTSIDE_INPUT, "listed, but it lies under none of this run's --input roots "
                                         "(the run's listing named it): never read")

    def read(self, uri: str, limit: int) -> bytes:
        """At most limit + 1 bytes of `uri`. Raises ReadFailed."""
        refused = self.outside(uri)
        if refused is not None:
            raise refused
        if not uri.startswith("s3://"):
            try:
                return read_local(uri, limit, self.cfg.local_roots) if "://" not in uri else read_capped(uri, limit)
            except ReadFailed:
                raise
            except Exception as err:
                raise ReadFailed(UNREADABLE, f"read failed: {type(err).__name__}: {err}") from err
        return self._read_s3(uri, limit)

    def _read_s3(self, uri: str, limit: int) -> bytes:
        from botocore.exceptions import ClientError, IncompleteReadError, ResponseStreamingError

        parsed = urlparse(uri)
        bucket, key = parsed.netloc, parsed.path.lstrip("/")
        attempts = max(1, self.cfg.max_attempts)
        for attempt in range(1, attempts + 1):
            try:
                response = self.client().get_object(Bucket=bucket, Key=key, Range=f"bytes=0-{limit}")
                return response["Body"].read()
            except (ResponseStreamingError, IncompleteReadError) as err:  # the body was cut off: read it again
                if attempt == attempts:
                    raise ReadFailed(STORAGE_ERROR, f"read failed after {attempts} attempts: {err}") from err
            except ClientError as err:
                if err.response.get("Error", {}).get("Code") == "InvalidRange":  # a zero-byte object
                    return b""
                raise _failed(err) from err
            except Exception as err:
                raise _failed(err) from err
        raise AssertionError("unreachable")


def _failed(err: Exception) -> ReadFailed:
    reason = STORAGE_ERROR if is_storage_failure(err) else UNREADABLE
    return ReadFailed(reason, f"read failed: {type(err).__name__}: {err}")
