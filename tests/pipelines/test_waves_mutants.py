"""What a refused resume says about the changed wave files: their names (not the folder again for each), at
most five and then `...`; and what a pipeline without a listing (`--wave-objects 0`) is built from: this tenant's
earlier `pages` (the result cache), the time window as given and the run's Beam options (mutants that printed
each file's whole path, looked the earlier pages up under no tenant, dropped `--since` or the options survived
`make mutate`; docs/development.md "Mutation score"). No pipeline runs: the builder is stopped by an injected
fault once it has its arguments."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions

from pipelines.run import graph, waves
from pipelines.run.waves import changed_message
from schemas import tables
from schemas.layout import partition
from transforms.store.listing_file import Listing
from transforms.store.write import write_rows

FOLDER = "/out/listings/tenant=t/run_id=r"


def test_the_message_names_the_changed_files_once_under_their_folder() -> None:
    message = changed_message(Listing(FOLDER, 3, 3, 3, ("/in/",), ("a", "b", "c")), [0, 2])
    assert f"(wave-00000.parquet, wave-00002.parquet under {FOLDER}:" in message
    assert message.count(FOLDER) == 1 and "--force" in message


def test_more_than_five_changed_files_are_cut() -> None:
    listing = Listing(FOLDER, 7, 7, 7, ("/in/",), tuple("abcdefg"))
    message = changed_message(listing, list(range(7)))
    assert "wave-00004.parquet ... under" in message and "wave-00005" not in message
    assert "..." not in changed_message(listing, list(range(5)))


class Built(Exception):
    """Raised by the injected builder: the pipeline is never run."""


def test_without_a_listing_the_pipeline_gets_this_tenants_earlier_pages_and_the_window(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = str(tmp_path)
    for tenant in ("t", "other"):
        write_rows(partition(out, "pages", tenant, "earlier"), tables.PAGES,
                   [{"run_id": "earlier", "tenant": tenant, "doc_sha256": "d", "page_index": 0}])
    mine = sorted(str(p) for p in (tmp_path / "pages" / "tenant=t").rglob("*.parquet"))
    seen: dict[str, Any] = {}

    def builder(p: object, s: object, run: object, earlier_files: list[str], done_files: list[str],
                since: float | None = None, until: float | None = None, **_: object) -> None:
        seen.update(earlier=sorted(earlier_files), since=since, until=until,
                    workers=p.options.view_as(DirectOptions).direct_num_workers)  # type: ignore[attr-defined]
        raise Built

    monkeypatch.setattr(graph, "build_pipeline", builder)
    settings = SimpleNamespace(output=out, tenant="t")
    with pytest.raises(Built):
        waves._one_wave(PipelineOptions(["--direct_num_workers", "3"]), settings, {"run_id": "now"}, None, 0, 100.0,
                  200.0, False)
    assert seen == {"earlier": mine, "since": 100.0, "until": 200.0, "workers": 3} and len(mine) == 1
    with pytest.raises(Built):  # --force: nothing earlier is reused
        waves._one_wave(PipelineOptions([]), settings, {"run_id": "now"}, None, 0, None, None, True)
    assert seen["earlier"] == []
