"""A run through hosted batches (`--engine openai_batch`): the launcher's loop around the run's pipeline, and
`pagemill cancel`. Work that outlives the launcher: the batches are recorded durably before anyone waits for them
(transforms/engines/openai_batch/driver.py), and a launcher may leave while they work (exit 75) and a later one
collects them, submitting nothing twice.

One invocation: a driver step first (recover, poll, collect, resubmit, submit). While any batch works, the run
says so and exits 75 (EX_TEMPFAIL), or with --wait polls again (doubling pauses up to --batch-poll-s). Once none
works, the pipeline runs: each page is answered from the collected results or fails `batch_pending` with its
request spooled (transforms/engines/openai_batch/engine.py); its rows are written by the same writers and post-
filter as any run. A second step submits the spool; pages still pending make the run exit 75 (or wait) again; a
run without pending pages goes on to its manifest and exit code as any other.

Pass after pass, a document with a `batch_pending` page is processed again (transforms/output/cache.py: its
`documents` row does not make it done), and its new rows supersede the pending ones by the kept-row rule
(schemas/kept_row.py: an answer beats a failed row, a later attempt an earlier one): each pass is a new attempt
(`created_at`), and the run is settled (compacted) after each pass, so it ends with one row per key.
"""
from __future__ import annotations

import datetime as dt
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from schemas.run_place import RunPlace

MAX_EMPTY_PASSES = 2  # passes in a row that leave pages pending yet submit nothing (a lost spool): then an error


class TryLater(Exception):
    """The run's batches are working: exit 75, run the same command again later."""


def batch_waves(o: Any, engine: Any, run: dict[str, Any], storage: Any, listing: Any,
                waves: Callable[[], tuple[Any, dict[str, Any]]],
                sleep: Callable[[float], None] = time.sleep,
                place: RunPlace | None = None) -> tuple[Any, dict[str, Any]]:
    """Run `waves` (the run's pipeline) as often as the batches need, or raise TryLater. Returns its last
    result, once no page of the run is pending. The run's batches are held (lock.py) for all of it: a second
    launcher of the same run is refused with TryLater. `place`: the run's (default the options' --output,
    --tenant and --run-id)."""
    place = place or RunPlace(o.output, o.tenant, o.run_id)
    from transforms.engines.openai_batch.lock import LauncherBusy, launcher_lock

    try:
        with launcher_lock(engine.folder):
            return _passes(o, place, engine, run, storage, listing, waves, sleep)
    except LauncherBusy as busy:  # a second launcher of the run: it would submit the same spool again
        raise TryLater(f"pagemill: run {place.run_id}: {busy}; exit 75: nothing was submitted by this one: run the "
                       f"same command again once that launcher has ended") from None


def _passes(o: Any, place: RunPlace, engine: Any, run: dict[str, Any], storage: Any, listing: Any,
            waves: Callable[[], tuple[Any, dict[str, Any]]],
            sleep: Callable[[float], None]) -> tuple[Any, dict[str, Any]]:
    from pipelines.run.retries import settle
    from schemas.reasons import BATCH_PENDING
    from transforms.engines.openai_batch.driver import BatchDriver

    driver = BatchDriver(engine)
    pause, empty = 1.0, 0
    try:
        while True:
            report = driver.step()
            if report.working:
                _say(place, report, "still working")
                if not o.wait:
                    raise TryLater(_later(place, report))
                sleep(pause)
                pause = min(max(1.0, o.batch_poll_s), pause * 2)
                continue
            _reopen_waves(o, listing)
            run["created_at"] = dt.datetime.now(dt.UTC)  # each pass is a new attempt (schemas/kept_row.py)
            result = waves()
            counts, _ = settle(place.output, place.tenant, place.run_id, storage)
            pending = int((counts.get("page_reasons") or {}).get(BATCH_PENDING, 0))
            report = driver.step()  # the pass's spool becomes batches
            if not pending:
                return result
            _say(place, report, f"{pending} pages wait for them")
            empty = 0 if report.submitted or report.working else empty + 1
            if empty >= MAX_EMPTY_PASSES:
                raise RuntimeError(f"{pending} pages are pending but no request of theirs was spooled in "
                                   f"{empty} passes (the batch folder {engine.folder} is not writable?)")
            if report.working and not o.wait:
                raise TryLater(_later(place, report))
    finally:
        driver.close()


def _later(place: RunPlace, report: Any) -> str:
    return (f"pagemill: run {place.run_id}: {report.working} batches working; exit 75: run the same command "
            f"with --run-id {place.run_id} later to collect them (or add --wait)")


def _say(place: RunPlace, report: Any, what: str) -> None:
    from pipelines.run.run_log import screen_err  # the screen, not the run's log (the run is under way)

    print(f"pagemill: run {place.run_id}: batches {what}: {report.working} working, {report.batches} created "
          f"({report.submitted} requests), {report.collected} collected, {report.resubmitted} requests resubmitted, "
          f"{report.failed} failed", file=screen_err(), flush=True)


def _reopen_waves(o: Any, listing: Any) -> None:
    """A wave marked done may hold pending pages: the next pass reads every wave again (its finished
    documents are skipped by their rows, so only the pending ones are processed)."""
    if listing is None:
        return
    from transforms.store.listing_file import reopen_waves

    reopen_waves(listing.folder, listing.waves)


def manifest_batches(engine: Any) -> dict[str, Any]:
    """The run manifest's `batches`: each batch's id, status and request counts as the provider reported them."""
    from transforms.engines.openai_batch.driver import summary
    from transforms.engines.openai_batch.files import load_state

    return summary(load_state(engine.folder, engine.run_key))


def cancel_command(argv: Sequence[str]) -> int:
    """`pagemill cancel --output DIR --run-id ID [--tenant T] --endpoint URL [--api-key-env VAR] [--engine
    openai-batch|anthropic-batch]`: cancel the run's batches. Nothing more is submitted; a later `pagemill run`
    collects what finished, and the rest of the run's pages fail `batch_cancelled`."""
    import argparse

    from pipelines.config.engine import batch_settings
    from pipelines.config.storage import add_storage_args, configure, storage_from
    from schemas.layout import batch_folder
    from transforms.engines.openai_batch.driver import BatchDriver

    parser = argparse.ArgumentParser(prog="pagemill cancel", allow_abbrev=False)
    for flag in ("--output", "--run-id", "--endpoint"):
        parser.add_argument(flag, required=True)
    parser.add_argument("--tenant", default="default")
    parser.add_argument("--api-key-env", default=None)
    parser.add_argument("--model", default="")
    parser.add_argument("--engine", default="openai-batch", choices=("openai-batch", "anthropic-batch"))
    add_storage_args(parser)
    args = parser.parse_args(list(argv))
    configure(storage_from(vars(args)))
    s = batch_settings(args.engine, endpoint=args.endpoint, model=args.model, api_key_env=args.api_key_env,
                       folder=batch_folder(args.output, args.tenant, args.run_id),
                       run_key=f"{args.tenant}/{args.run_id}")
    from pipelines.run.exit_codes import TRY_LATER
    from transforms.engines.openai_batch.lock import LauncherBusy, launcher_lock

    driver = BatchDriver(s)
    try:
        with launcher_lock(s.folder):  # a launcher's state writes would undo the cancel's
            asked = driver.cancel()
    except LauncherBusy as busy:
        print(f"pagemill cancel: run {args.run_id}: {busy}; exit 75: stop that launcher (a --wait one) or let "
              f"it exit, then cancel again", file=sys.stderr)
        return TRY_LATER
    except Exception as err:  # noqa: BLE001 - one clear line; what was cancelled is recorded
        print(f"pagemill cancel: {type(err).__name__}: {err}", file=sys.stderr)
        return 1
    finally:
        driver.close()
    print(f"pagemill cancel: run {args.run_id}: {len(asked)} batches asked to cancel; run `pagemill run` with "
          f"--run-id {args.run_id} to collect what finished (the rest fails `batch_cancelled`)")
    return 0
