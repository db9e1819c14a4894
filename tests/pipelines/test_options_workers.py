"""A local batch run uses one worker process a core unless told otherwise; Beam's own flags, another
runner or streaming are left alone."""
from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from pipelines.config.options import PagemillOptions
from pipelines.run.local_workers import (
    SMALL_RUN_PAGES,
    listed_pages,
    local_workers_flags,
    resolve_local_workers,
    small_listing,
    small_run,
)
from schemas.records import ListedObject
from tests.support import docmaker
from transforms.intake.inspection import IntakeLimits
from transforms.store.listing_file import write_listing

LIMITS = IntakeLimits(max_bytes=50 * 2**20, max_pages=5000, max_image_pixels=89_478_485)

MULTI = ["--direct_running_mode=multi_processing"]


AUTO = [*MULTI, "--direct_num_workers=0"]  # one a core, or in process for a small listing: the run decides


@pytest.mark.parametrize("flags,cores,expected", [
    (["--input", "x"], 2, AUTO),
    (["--input", "x"], 16, AUTO),
    (["--input", "x"], 1, []),  # one core: in this process
    (["--workers", "1"], 8, []),
    (["--workers=3"], 2, [*MULTI, "--direct_num_workers=3"]),
    (["--direct_running_mode=in_memory"], 8, []),  # Beam's flags win
    (["--direct_num_workers=4"], 8, []),
    (["--direct_running_mode", "multi_processing"], 8, []),
    (["--runner=PortableRunner"], 8, []),
    (["--runner", "DataflowRunner"], 8, []),
    (["--streaming"], 8, []),
    (["--runner=DirectRunner"], 4, AUTO),
])
def test_local_workers_flags(flags: list[str], cores: int, expected: list[str]) -> None:
    assert local_workers_flags(flags, cores) == expected


@pytest.mark.parametrize("flags,small,expected", [
    ([], False, ("multi_processing", 6)),  # `--workers 0`: one a usable core
    ([], True, ("in_memory", 1)),  # a small listing starts no pool
    (["--workers", "3"], True, ("multi_processing", 3)),  # chosen: left alone
    (["--direct_running_mode=multi_processing", "--direct_num_workers=2"], True, ("multi_processing", 2)),
])
def test_the_run_resolves_auto_workers(flags: list[str], small: bool, expected: tuple[str, int]) -> None:
    from apache_beam.options.pipeline_options import DirectOptions

    flags = ["--input", "x", "--output", "y", *flags]
    options = PagemillOptions(flags + local_workers_flags(flags, 6))
    resolve_local_workers(options, 6, small)
    direct = options.view_as(DirectOptions)
    assert (direct.direct_running_mode, direct.direct_num_workers) == expected
    assert options.get_all_options()["direct_running_mode"] == expected[0]  # what the workers are handed


def test_small_run() -> None:
    assert small_run(6, 100_000, 1) and small_run(32, 2 * 2**20, SMALL_RUN_PAGES)
    assert not small_run(33, 1000, 1) and not small_run(1, 2 * 2**20 + 1, 1)
    # One small file of many pages is not a small run, nor one whose pages could not be counted.
    assert not small_run(1, 1000, SMALL_RUN_PAGES + 1) and not small_run(1, 1000, None)


def write_inputs(folder, docs: dict[str, bytes]) -> list[ListedObject]:
    folder.mkdir()
    for name, data in docs.items():
        (folder / name).write_bytes(data)
    return [ListedObject(uri=str(folder / name), size=len(data)) for name, data in sorted(docs.items())]


def test_listed_pages_counts_page_trees_and_frames(tmp_path) -> None:
    objects = write_inputs(tmp_path / "in", {"a.pdf": docmaker.multipage_pdf(5), "b.tiff": docmaker.multipage_tiff(3),
                                             "c.png": docmaker.tiny_png(), "d.pdf": docmaker.encrypted_pdf(),
                                             "notes.txt": b"not a document"})
    uris = [o.uri for o in objects]

    def read(uri: str) -> bytes:
        with open(uri, "rb") as handle:
            return handle.read()

    # Intake rejects the encrypted PDF and the text file: they count no pages; nor does a document over --max-pages.
    assert listed_pages(uris, read, LIMITS) == 5 + 3 + 1
    assert listed_pages(uris, read, replace(LIMITS, max_pages=4)) == 3 + 1

    def failing(uri: str) -> bytes:
        raise OSError("gone")

    assert listed_pages(uris, failing, LIMITS) is None


@pytest.mark.parametrize("pages,small", [(3, True), (400, False)])
def test_a_listing_of_one_long_pdf_is_not_small(tmp_path, pages: int, small: bool) -> None:
    from transforms.intake.reading import ReadConfig

    objects = write_inputs(tmp_path / "in", {"one.pdf": docmaker.multipage_pdf(pages)})
    assert objects[0].size <= 2 * 2**20  # small by objects and bytes: only its pages tell
    listing = write_listing(str(tmp_path / "listing"), objects, 5000)
    settings = SimpleNamespace(read=ReadConfig(), intake=LIMITS)  # what small_listing reads of the run's
    assert small_listing(listing, settings) is small


@pytest.mark.parametrize("flag", ["--workers", "--render-range-pages"])
def test_negative_counts_are_usage_errors(flag: str, tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    from pipelines import cli

    (tmp_path / "in").mkdir()
    code = cli.main(["run", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"), "--extract", "false",
                     flag, "-1"])
    assert code == 2 and f"{flag} -1 is negative" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
