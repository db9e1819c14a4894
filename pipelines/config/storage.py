"""Storage options shared by every command that touches object storage (run, sql, estimate, report).

Credentials never go into the process environment (so no child inherits them): the launcher's Beam
FileSystems, pre-flight's boto3 client and DuckDB's pyarrow filesystem get them as arguments, and worker
processes get them as Beam's own S3 pipeline options (`--s3_access_key_id`, ...), which Beam hands to
every SDK worker with the rest of the options. A `--s3-profile` is resolved to keys here, once, because
workers on other machines have no profile file. Children that do not need them (Tesseract) get a
minimal environment of their own (transforms/hints/ocr.py).
"""
from __future__ import annotations

import argparse
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow.fs as pafs

SECRET_OPTIONS = ("s3_access_key_id", "s3_secret_access_key", "s3_session_token")
# Every Beam option that holds a credential, never written to a manifest: the S3 keys above and Azure's
# connection string (it carries the account key). Beam's other storage options (hdfs_user, the Azure managed
# identity's client id, a KMS key's name) name an identity or a resource, not a secret.
CREDENTIAL_OPTIONS = frozenset({*SECRET_OPTIONS, "azure_connection_string"})
# The SDK worker's module logs every pipeline option at INFO on start; run with -m it logs as __main__.
QUIET_WORKER_LOGGERS = ("apache_beam.runners.worker.sdk_worker_main", "__main__")


@dataclass(frozen=True)
class StorageConfig:
    s3_endpoint_url: str | None = None
    s3_region: str | None = None
    s3_profile: str | None = None
    s3_access_key_id: str | None = field(default=None, repr=False)
    s3_secret_access_key: str | None = field(default=None, repr=False)
    s3_session_token: str | None = field(default=None, repr=False)

    def beam_flags(self) -> list[str]:
        """Beam's S3Options: what its boto3 client reads, in the launcher and in every worker."""
        flags = []
        for name in ("s3_endpoint_url", *SECRET_OPTIONS):
            value = getattr(self, name)
            if value:
                flags.append(f"--{name}={value}")
        if self.s3_region:
            flags.append(f"--s3_region_name={self.s3_region}")
        if any(getattr(self, name) for name in SECRET_OPTIONS):
            # Beam's SDK worker logs every pipeline option at INFO when it starts: not these.
            quiet = json.dumps(dict.fromkeys(QUIET_WORKER_LOGGERS, "WARNING"))
            flags.append(f"--sdk_harness_log_level_overrides={quiet}")
        return flags


def add_storage_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("storage")
    for name, help_text in (("s3_endpoint_url", "S3-compatible endpoint (MinIO, Ceph, R2, tests)"),
                            ("s3_region", "S3 region"), ("s3_profile", "AWS profile name"),
                            ("s3_access_key_id", "S3 access key (else the AWS chain)"),
                            ("s3_secret_access_key", "S3 secret key (else the AWS chain)")):
        group.add_argument(f"--{name.replace('_', '-')}", f"--{name}", dest=name, default=None, help=help_text)


def command_line_secrets(argv: Sequence[str]) -> list[str]:
    """Pure: the credential flags given on a command line (`--s3-secret-access-key X`, `--s3_session_token=X`):
    every local user can read a process's arguments (ps, /proc/PID/cmdline), and shells keep them in history."""
    names = {a.lstrip("-").split("=", 1)[0].replace("-", "_") for a in argv if a.startswith("--")}
    return [f"--{n.replace('_', '-')}" for n in SECRET_OPTIONS if n in names]


def secrets_warning(argv: Sequence[str]) -> str | None:
    """The warning for credentials on the command line (None: there are none)."""
    found = command_line_secrets(argv)
    if not found:
        return None
    return (f"pagemill: warning: {', '.join(found)} on the command line can be read by every local user (ps) and "
            "stays in shell history; give the keys as AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY in the environment "
            "or as --s3-profile NAME from ~/.aws/credentials (docs/safety.md)")


def storage_from(values: Mapping[str, Any]) -> StorageConfig:
    """From parsed arguments or pipeline options; Beam's `s3_region_name` is accepted too."""
    storage = StorageConfig(
        s3_endpoint_url=values.get("s3_endpoint_url"),
        s3_region=values.get("s3_region") or values.get("s3_region_name"),
        s3_profile=values.get("s3_profile"),
        s3_access_key_id=values.get("s3_access_key_id"),
        s3_secret_access_key=values.get("s3_secret_access_key"),
        s3_session_token=values.get("s3_session_token"),
    )
    return resolve_profile(storage) if storage.s3_profile and not storage.s3_access_key_id else storage


def resolve_profile(storage: StorageConfig) -> StorageConfig:
    """Keys (and region) of `--s3-profile`, so that they reach workers as options, not as AWS_PROFILE."""
    import boto3
    import botocore.exceptions

    try:
        session = boto3.Session(profile_name=storage.s3_profile)
        creds = session.get_credentials()
    except botocore.exceptions.BotoCoreError:
        return storage  # pre-flight reports the profile it cannot use
    if creds is None:
        return storage
    frozen = creds.get_frozen_credentials()
    return replace(storage, s3_access_key_id=frozen.access_key, s3_secret_access_key=frozen.secret_key,
                   s3_session_token=frozen.token, s3_region=storage.s3_region or session.region_name)


def configure(storage: StorageConfig) -> None:
    """Point this process's Beam FileSystems (listing, pre-flight, the manifest) at the storage settings.
    Nothing is written to the environment."""
    from apache_beam.io.filesystems import FileSystems
    from apache_beam.options.pipeline_options import PipelineOptions

    FileSystems.set_options(PipelineOptions(storage.beam_flags()))


def arrow_filesystem(uri: str, storage: StorageConfig) -> tuple[pafs.FileSystem, str]:
    """A pyarrow filesystem and the path inside it, for DuckDB over local or s3:// outputs."""
    if uri.startswith("s3://"):
        kwargs: dict[str, Any] = {}
        if storage.s3_endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3"):
            endpoint = storage.s3_endpoint_url or os.environ["AWS_ENDPOINT_URL_S3"]
            kwargs["endpoint_override"] = endpoint
            if endpoint.startswith("http://"):
                kwargs["scheme"] = "http"
        if storage.s3_region or os.environ.get("AWS_DEFAULT_REGION"):
            kwargs["region"] = storage.s3_region or os.environ["AWS_DEFAULT_REGION"]
        if storage.s3_access_key_id:
            kwargs["access_key"] = storage.s3_access_key_id
            kwargs["secret_key"] = storage.s3_secret_access_key
            if storage.s3_session_token:
                kwargs["session_token"] = storage.s3_session_token
        return pafs.S3FileSystem(**kwargs), uri.removeprefix("s3://").rstrip("/")
    if "://" in uri and not uri.startswith("file://"):
        fs, path = pafs.FileSystem.from_uri(uri)
        return fs, path.rstrip("/")
    return pafs.LocalFileSystem(), os.path.abspath(uri.removeprefix("file://")).rstrip("/")
