"""Where a table's files lie (schemas/layout.py): paths of local roots and URIs, and what a path names."""
from __future__ import annotations

import fnmatch

from schemas import tables
from schemas.layout import (
    TABLE_KEYS,
    eval_path,
    is_part_file,
    join_uri,
    legacy_manifest_path,
    manifest_path,
    manifest_run_id,
    markdown_folder,
    part_glob,
    partition,
    root_problems,
    run_id_of,
    table_folder,
    tenant_of,
)


def test_paths_under_a_local_root_and_a_uri() -> None:
    assert partition("/data/out/", "pages", "acme", "r1") == "/data/out/pages/tenant=acme/run_id=r1"
    assert partition("s3://bucket/out", "ledger", "t", "r") == "s3://bucket/out/ledger/tenant=t/run_id=r"
    assert table_folder("bucket/out", "documents") == "bucket/out/documents"
    assert table_folder("bucket/out", "documents", "acme") == "bucket/out/documents/tenant=acme"
    assert join_uri("", "runs", "r.json") == "runs/r.json" and join_uri("/", "runs") == "runs"
    assert markdown_folder("s3://b/out/", "acme") == "s3://b/out/markdown/tenant=acme"
    assert eval_path("/data/out", "acme", "r1") == "/data/out/evals/tenant=acme/run_id=r1.json"


def test_globs_match_one_run_one_tenant_or_all() -> None:
    path = "s3://b/out/pages/tenant=acme/run_id=r1/part-0a.parquet"
    assert fnmatch.fnmatch(path, part_glob("s3://b/out", "pages", "acme", "r1"))
    assert fnmatch.fnmatch(path, part_glob("s3://b/out", "pages", "acme"))
    assert fnmatch.fnmatch(path, part_glob("s3://b/out", "pages"))
    assert not fnmatch.fnmatch(path, part_glob("s3://b/out", "pages", "globex"))
    assert not fnmatch.fnmatch(path, part_glob("s3://b/out", "documents"))
    assert not fnmatch.fnmatch(path + ".inprogress", part_glob("s3://b/out", "pages"))


def test_part_files_and_the_tenant_a_path_names() -> None:
    assert is_part_file("/o/pages/tenant=t/run_id=r/part-1.parquet")
    assert not is_part_file("/o/pages/tenant=t/run_id=r/part-1.parquet.inprogress")
    assert not is_part_file("/o/pages/beam-temp-x/part-1.parquet")
    assert tenant_of("/o/pages/tenant=acme/run_id=r/part-1.parquet") == "acme"
    assert tenant_of("/tenant=root/o/pages/tenant=acme/run_id=r/part-1.parquet") == "acme"  # the root's own
    assert tenant_of("/o/runs/r.json") is None


def test_every_table_has_keys_that_are_columns_of_its_schema() -> None:
    assert set(TABLE_KEYS) == set(tables.TABLES)
    for table, keys in TABLE_KEYS.items():
        assert {"tenant", "run_id"} <= set(keys) <= set(tables.SCHEMAS[table].names)


def test_manifests_live_under_their_tenant_and_roots_are_paths() -> None:
    assert manifest_path("s3://b/out", "acme", "r1") == "s3://b/out/runs/tenant=acme/r1.json"
    assert legacy_manifest_path("/o", "r1") == "/o/runs/r1.json"
    assert manifest_run_id("/o/runs/tenant=acme/r1.json") == manifest_run_id("/o/runs/r1.json") == "r1"
    assert tenant_of(manifest_path("/o", "acme", "r1")) == "acme"
    assert tenant_of(legacy_manifest_path("/o", "r1")) is None
    assert run_id_of(partition("/o", "pages", "acme", "r1") + "/part-x.parquet") == "r1" and run_id_of("/o/x") is None
    assert root_problems("/data/out-1.2_b") == [] and root_problems("s3://bucket/out") == []
    for root in ("out[12]", "out*", "o?t", "a[b*"):
        (problem,) = root_problems(root)
        assert problem.startswith(f"--output {root!r}: an output root is a path, not a pattern")
