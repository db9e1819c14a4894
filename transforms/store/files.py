"""The one module that lists the tables' part files (schemas/layout.py says where they lie): a run's, a tenant's,
which tenants hold a run id, through Beam's FileSystems (the launcher and the workers) or a pyarrow filesystem
(DuckDB's datasets in `pagemill sql`), and the manifests under `runs/`. Every reader and writer of the tables
asks here; tests/test_repository.py checks that no other module builds a table's file pattern."""
from __future__ import annotations

import pyarrow.fs as pafs

from schemas import layout, tables


def _matches(pattern: str) -> list[str]:
    from apache_beam.io.filesystems import FileSystems  # not at import: `pagemill sql` lists through pyarrow only

    return sorted(m.path for m in FileSystems.match([pattern])[0].metadata_list)


def _root(output: str) -> str:
    """`output`, once it is known to be a path and not a pattern (layout.root_problems): every pattern below
    is built on it, so a wildcard in it would list, merge or delete other roots' files."""
    problems = layout.root_problems(output)
    if problems:
        raise ValueError(problems[0])
    return output


def run_files(output: str, table: str, tenant: str, run_id: str) -> list[str]:
    """The finished part files of one run of one tenant in one table."""
    return _matches(layout.part_glob(_root(output), table, tenant, run_id))


def partition_files(output: str, table: str, tenant: str, run_id: str) -> list[str]:
    """Every file in one run's partition of one table, finished or not (what `--force` clears)."""
    return _matches(layout.join_uri(layout.partition(_root(output), table, tenant, run_id), "*"))


def tenant_files(output: str, table: str, tenant: str) -> list[str]:
    """This tenant's finished part files of one table, every run (`pages`: the result cache's source)."""
    pattern = layout.part_glob(_root(output), table, tenant)
    try:
        return _matches(pattern)
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
    """Finished Parquet files of one table, or of one tenant's partitions."""
    selector = pafs.FileSelector(layout.table_folder(root, table, tenant), allow_not_found=True, recursive=True)
    return sorted(i.path for i in fs.get_file_info(selector)
                  if i.type == pafs.FileType.File and layout.is_part_file(i.path))


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
