"""Storage options shared by every command that touches object storage (run, sql, estimate, report).

Beam's own S3 options (`--s3_endpoint_url`, keys) reach the launching process, but worker processes
(multi-process DirectRunner, portable runners) only see them reliably through the standard AWS
environment variables, so the options are exported there for the workers this process starts.
"""
from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow.fs as pafs


@dataclass(frozen=True)
class StorageConfig:
    s3_endpoint_url: str | None = None
    s3_region: str | None = None
    s3_profile: str | None = None
    s3_access_key_id: str | None = None
    s3_secret_access_key: str | None = None

    def env(self) -> dict[str, str]:
        """The AWS environment that boto3 (and so Beam's S3 filesystem) reads in every process."""
        pairs = {
            "AWS_ENDPOINT_URL_S3": self.s3_endpoint_url,
            "AWS_DEFAULT_REGION": self.s3_region,
            "AWS_PROFILE": self.s3_profile,
            "AWS_ACCESS_KEY_ID": self.s3_access_key_id,
            "AWS_SECRET_ACCESS_KEY": self.s3_secret_access_key,
        }
        return {k: v for k, v in pairs.items() if v}

    def beam_flags(self) -> list[str]:
        flags = []
        for name in ("s3_endpoint_url", "s3_access_key_id", "s3_secret_access_key"):
            value = getattr(self, name)
            if value:
                flags.append(f"--{name}={value}")
        if self.s3_region:
            flags.append(f"--s3_region_name={self.s3_region}")
        return flags


def add_storage_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("storage")
    for name, help_text in (("s3_endpoint_url", "S3-compatible endpoint (MinIO, Ceph, R2, tests)"),
                            ("s3_region", "S3 region"), ("s3_profile", "AWS profile name"),
                            ("s3_access_key_id", "S3 access key (else the AWS chain)"),
                            ("s3_secret_access_key", "S3 secret key (else the AWS chain)")):
        group.add_argument(f"--{name.replace('_', '-')}", f"--{name}", dest=name, default=None, help=help_text)


def storage_from(values: Mapping[str, Any]) -> StorageConfig:
    """From parsed arguments or pipeline options; Beam's `s3_region_name` is accepted too."""
    return StorageConfig(
        s3_endpoint_url=values.get("s3_endpoint_url"),
        s3_region=values.get("s3_region") or values.get("s3_region_name"),
        s3_profile=values.get("s3_profile"),
        s3_access_key_id=values.get("s3_access_key_id"),
        s3_secret_access_key=values.get("s3_secret_access_key"),
    )


def configure(storage: StorageConfig) -> None:
    """Export the storage settings for this process and the worker processes it starts, and point
    Beam's FileSystems (used by the launcher for listing, pre-flight and the manifest) at them."""
    from apache_beam.io.filesystems import FileSystems
    from apache_beam.options.pipeline_options import PipelineOptions

    os.environ.update(storage.env())
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
        return pafs.S3FileSystem(**kwargs), uri.removeprefix("s3://").rstrip("/")
    if "://" in uri and not uri.startswith("file://"):
        fs, path = pafs.FileSystem.from_uri(uri)
        return fs, path.rstrip("/")
    return pafs.LocalFileSystem(), os.path.abspath(uri.removeprefix("file://")).rstrip("/")
