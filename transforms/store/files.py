"""The one module that lists the tables' part files (schemas/layout.py says where they lie): a run's, a tenant's,
which tenants hold a run id, through Beam's FileSystems (the launcher and the workers) or a pyarrow filesystem
(DuckDB's datasets in `pagemill sql`), and the manifests under `runs/`. Every reader and writer of the tables
asks here; tests/test_repository.py checks that no other module builds a table's file pattern.

Every listing of finished part files leaves out two kinds: a file whose rows are not its folder's
(transforms/store/part_check.py: warned, never read, committed or compacted), and a file that a compaction with a
catalog replaced but kept for the snapshots that still name it (a `<compacted>.replaces.json` beside the new file
names them; `pagemill expire` deletes them once no snapshot does)."""
from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

import pyarrow.fs as pafs

from schemas import layout, tables
from transforms.store import part_check
from transforms.store.part_names import REPLACES_SUFFIX, replaced_part


def _matches(pattern: str) -> list[str]:
    return sorted(m.path for m in _metadata(pattern))


def _metadata(pattern: str) -> list[Any]:
    from apache_beam.io.filesystems import FileSystems  # not at import: `pagemill sql` lists through pyarrow only

    return sorted(FileSystems.match([pattern])[0].metadata_list, key=lambda m: m.path)


def _beam_open(path: str) -> Callable[[], Any]:
    def opener() -> Any:
        from apache_beam.io.filesystem import CompressionTypes
        from apache_beam.io.filesystems import FileSystems

        return FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)
    return opener


def replaced_by(sidecars: Iterable[tuple[str, bytes]], present: set[str]) -> set[str]:
    """Pure: the part files that `sidecars` ((path, its bytes)) name as replaced, each in its own folder, counting
    a sidecar only when the compacted file beside it is `present` (it is written first: a sidecar without it
    would hide rows that no file holds any more). A sidecar that is not a JSON list of names counts for nothing."""
    gone: set[str] = set()
    for path, text in sidecars:
        folder, name = path.rsplit("/", 1)
        if f"{folder}/{replaced_part(name)}" not in present:
            continue
        try:
            names = json.loads(text)
        except ValueError:
            continue
        if isinstance(names, list):
            gone.update(f"{folder}/{n}" for n in names if isinstance(n, str) and "/" not in n)
    return gone


def sidecar_text(replaced: Iterable[str]) -> str:
    """The `.replaces.json` of a compaction that kept the files it replaced: their names."""
    return json.dumps(sorted(p.rsplit("/", 1)[-1] for p in replaced))


def _kept_beam(pattern: str) -> tuple[list[str], dict[str, str]]:
    """(the finished part files that `pattern` matches, less the replaced and the refused; path -> why refused)."""
    from apache_beam.io.filesystems import FileSystems

    found = _metadata(pattern)
    present = {m.path for m in found}
    sidecar_glob = pattern.rsplit("/", 1)[0] + "/*" + REPLACES_SUFFIX
    try:
        sidecars = _metadata(sidecar_glob)
    except Exception:  # noqa: BLE001 - no folder yet
        sidecars = []
    texts = []
    for m in sidecars:
        with FileSystems.open(m.path) as handle:
            texts.append((m.path, handle.read()))
    gone = replaced_by(texts, present)
    live = [m for m in found if m.path not in gone]
    refused = part_check.misfiled([(m.path, _beam_open(m.path), m.size_in_bytes, m.last_updated_in_seconds)
                                   for m in live])
    return [m.path for m in live if m.path not in refused], refused


def _root(output: str) -> str:
    """`output`, once it is known to be a path and not a pattern (layout.root_problems): every pattern below
    is built on it, so a wildcard in it would list, merge or delete other roots' files."""
    problems = layout.root_problems(output)
    if problems:
        raise ValueError(problems[0])
    return output


def run_files(output: str, table: str, tenant: str, run_id: str) -> list[str]:
    """The finished part files of one run of one tenant in one table (not the replaced, not the refused)."""
    return _kept_beam(layout.part_glob(_root(output), table, tenant, run_id))[0]


def misfiled_run_files(output: str, tenant: str, run_id: str) -> dict[str, str]:
    """path -> why, for the part files in this run's partitions whose rows are not the run's (the manifest's
    `misfiled_files`)."""
    refused: dict[str, str] = {}
    for table in tables.TABLES:
        try:
            refused.update(_kept_beam(layout.part_glob(_root(output), table, tenant, run_id))[1])
        except Exception:  # noqa: BLE001 - nothing written yet
            continue
    return refused


def partition_files(output: str, table: str, tenant: str, run_id: str) -> list[str]:
    """Every file in one run's partition of one table, finished or not (what `--force` clears)."""
    return _matches(layout.join_uri(layout.partition(_root(output), table, tenant, run_id), "*"))


def tenant_files(output: str, table: str, tenant: str) -> list[str]:
    """This tenant's finished part files of one table, every run (`pages`: the result cache's source)."""
    pattern = layout.part_glob(_root(output), table, tenant)
    try:
        return _kept_beam(pattern)[0]
    except Exception:  # noqa: BLE001 - no output yet
        return []


def run_tenants(output: str, run_id: str, tenant: str = "*") -> set[str]:
    """Tenants that have rows under this run id in any table (`tenant`: look in that tenant's folders only).
    Each tenant's run ids are its own: two tenants may hold the same one, in separate partitions."""
    found = set()
    for table in tables.TABLES:
        pattern = layout.part_glob(_root(output), table, tenant, run_id)
        try:
            paths = _matches(pattern)
        except Exception:  # noqa: BLE001 - nothing written yet
            continue
        found.update(t for t in map(layout.tenant_of, paths) if t is not None)
    return found


def table_files(fs: pafs.FileSystem, root: str, table: str, tenant: str | None = None) -> list[str]:
    """Finished Parquet files of one table, or of one tenant's partitions (not the replaced, not the refused)."""
    selector = pafs.FileSelector(layout.table_folder(root, table, tenant), allow_not_found=True, recursive=True)
    infos = [i for i in fs.get_file_info(selector) if i.type == pafs.FileType.File]
    parts = {i.path: i for i in infos if layout.is_part_file(i.path)}
    gone = replaced_by(((i.path, _read(fs, i.path)) for i in infos if i.path.endswith(REPLACES_SUFFIX)), set(parts))
    live = [i for p, i in sorted(parts.items()) if p not in gone]
    refused = part_check.misfiled([(i.path, _arrow_open(fs, i.path), i.size, float(i.mtime_ns or 0))
                                   for i in live])
    return [i.path for i in live if i.path not in refused]


def replaced_files(fs: pafs.FileSystem, root: str, table: str) -> dict[str, list[str]]:
    """sidecar path -> the part files it names as replaced that are still on disk (`pagemill expire`)."""
    selector = pafs.FileSelector(layout.table_folder(root, table), allow_not_found=True, recursive=True)
    infos = [i for i in fs.get_file_info(selector) if i.type == pafs.FileType.File]
    present = {i.path for i in infos if layout.is_part_file(i.path)}
    found = {}
    for i in infos:
        if i.path.endswith(REPLACES_SUFFIX):
            found[i.path] = sorted(replaced_by([(i.path, _read(fs, i.path))], present) & present)
    return found


def _read(fs: pafs.FileSystem, path: str) -> bytes:
    with fs.open_input_stream(path) as handle:
        return handle.read()


def _arrow_open(fs: pafs.FileSystem, path: str) -> Callable[[], Any]:
    return lambda: fs.open_input_file(path)


def manifest_files(fs: pafs.FileSystem, root: str, tenant: str | None = None) -> list[tuple[str, str | None]]:
    """(path, the tenant its folder names) of the manifests of `tenant`'s runs (None: every tenant's):
    `runs/tenant=<t>/<id>.json`, and an old-layout `runs/<id>.json` only for a run id that the tenant's own
    partitions hold and that has no new-layout manifest of that tenant: a file planted in `runs/` speaks for
    no one else. (With every tenant's, `runs_table` drops an old-layout file whose tenant has a new one.)"""
    def jsons(folder: str) -> list[str]:
        infos = fs.get_file_info(pafs.FileSelector(folder, allow_not_found=True, recursive=True))
        return sorted(i.path for i in infos if i.type == pafs.FileType.File and i.path.endswith(".json"))

    def folder_tenant(path: str) -> str | None:  # the file's own folder only: the root may hold `tenant=` too
        return layout.tenant_of(path.rsplit("/", 2)[-2])

    runs = layout.join_uri(root, "runs")
    found = jsons(runs)
    new = [(path, folder_tenant(path)) for path in found
           if folder_tenant(path) is not None and tenant in (None, folder_tenant(path))]
    written = {layout.manifest_run_id(path) for path, _ in new}  # of `tenant`'s own folder, when given
    owned = {layout.run_id_of(path) for path in table_files(fs, root, "documents", tenant)} if tenant else set()
    top = runs.rstrip("/")
    legacy = [(path, None) for path in found if path.rsplit("/", 1)[0] == top
              and (tenant is None or (layout.manifest_run_id(path) in owned
                                      and layout.manifest_run_id(path) not in written))]
    return new + legacy


def local_write_problem(folder: str) -> str | None:
    """Pre-flight: why a local output root cannot be written (a probe file made and removed in it), or None."""
    import uuid
    from pathlib import Path

    path = Path(folder.removeprefix("file://"))
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".pagemill-preflight-{uuid.uuid4().hex}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        return f"{folder}: cannot write ({err.strerror or err})"
    return None
