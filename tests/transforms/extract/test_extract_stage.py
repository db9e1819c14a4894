"""The streaming extraction stage in a Beam pipeline over a simulated engine: lookups, not a join."""
from __future__ import annotations

import datetime as dt
import functools
from dataclasses import replace

import apache_beam as beam
from apache_beam.testing.util import assert_that

from tests.support.feed_setup import ENGINE, config, page
from transforms.engines.simulated import simulated
from transforms.extract.stage import ExtractPages, make_task


def test_repeats_wait_for_the_first_and_earlier_keys_are_cached() -> None:
    cfg = config()
    shared = page(1)
    pages = [replace(shared, source_uri=f"copy-{i}.pdf", doc_sha256=f"{i}" * 64) for i in range(3)]
    pages += [page(2), replace(page(3), pdq_hash="a" * 64, pdq_hash_low="b" * 64)]  # hashes from today's gate
    earlier_key = make_task(page(3), cfg)[0]
    old = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)
    earlier = [{"cache_key": earlier_key, "created_at": old - dt.timedelta(days=1), "extraction": '{"old": 1}',
                "status": "ok", "page_hash": "h", "config_key": cfg.config_key},
               {"cache_key": earlier_key, "created_at": old, "extraction": '{"newer": 1}', "status": "ok",
                "page_hash": "h", "config_key": cfg.config_key}]
    factory = functools.partial(simulated, slots=2, seconds=0.05)

    def check(rows: list) -> None:
        by_uri = {r.source_uri: r for r in rows}
        assert len(rows) == 5
        copies = sorted((by_uri[f"copy-{i}.pdf"].route, by_uri[f"copy-{i}.pdf"].status) for i in range(3))
        assert copies == [("duplicate", "duplicate"), ("duplicate", "duplicate"), ("model", "ok")]
        assert len({by_uri[f"copy-{i}.pdf"].extraction for i in range(3)}) == 1
        assert (by_uri["p2.png"].route, by_uri["p2.png"].status) == ("model", "ok")
        cached = by_uri["p3.png"]
        assert (cached.route, cached.status, cached.extraction) == ("cache", "cached", '{"newer": 1}')
        assert (cached.pdq_hash, cached.pdq_hash_low) == ("a" * 64, "b" * 64)  # the next run re-checks these
        for r in rows:
            assert r.rendered_at is not None and r.extracted_at >= r.rendered_at
            assert (r.cost_usd > 0) == (r.route == "model")

    with beam.Pipeline() as p:
        earlier_rows = p | "Earlier" >> beam.Create(earlier)
        rows = (p | beam.Create(pages) | ExtractPages(ENGINE, cfg, factory, earlier=earlier_rows))
        assert_that(rows, check)


ENGINES: list = []  # the engines the stage made (the DirectRunner runs the DoFn in this process)


def counting_engine(settings: object, slots: int) -> object:
    from tests.support.feed_setup import Counting

    ENGINES.append(Counting(slots=slots, seconds=0.02))
    return ENGINES[-1]


def test_the_stage_keeps_in_flight_twice_what_the_engine_says_it_runs() -> None:
    """The in-flight bound comes from the engine's own `sequences()` (here 1 slot: 2 pages), not from the
    vLLM settings' max_num_seqs (4 here: 8 pages) nor from asking what kind of engine it is."""
    ENGINES.clear()
    cfg = config()
    with beam.Pipeline() as p:
        _ = p | beam.Create([page(i) for i in range(12)]) | ExtractPages(
            ENGINE, cfg, functools.partial(counting_engine, slots=1))
    (engine,) = ENGINES
    assert engine.submitted == 12 and engine.peak == 2
