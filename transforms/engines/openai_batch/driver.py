"""The launcher's batch step (pipelines/run/batches.py calls it): recover, poll, collect, resubmit, submit.

Never twice while alive. A batch's request file is written and its entry recorded in the state (files.py) BEFORE
it is uploaded; its provider id is recorded right after `create`. A launcher killed between the two leaves an
entry without an id: the next step lists the provider's batches and adopts the one whose metadata names this run
and this request file's fingerprint (anthropic.py: by its time and size, having no metadata), and creates one
only when none does. Spooled requests whose custom_id any entry already holds are dropped, so a spool file read
twice (a kill before its deletion) submits nothing again.

Collecting a finished batch (completed, failed, expired or cancelled) reads its output and error files: each
answered custom_id's chat completion is kept (an expired batch's finished half included); every other request of
the batch is queued once more, up to --batch-max-resubmits times, then written as a failure with its reason code
(`batch_expired`, `batch_failed`, `batch_cancelled`). Lines naming custom_ids that the batch did not hold are
ignored (the provider's files are untrusted input). A step's API failures (429 past the retries, a 5xx on a
download) leave the work recorded for the next step.
"""
from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from schemas.reasons import BATCH_CANCELLED, BATCH_EXPIRED, BATCH_FAILED
from transforms.engines.openai_batch import files
from transforms.engines.openai_batch.client import REQUEST_FILE, RUN_KEY, BatchApiError, BatchClient
from transforms.engines.openai_batch.settings import OpenAIBatchSettings

log = logging.getLogger(__name__)
TERMINAL = frozenset({"completed", "failed", "expired", "cancelled"})  # OpenAI's; anthropic.py maps to them


def provider(s: OpenAIBatchSettings) -> BatchClient:
    """The provider's API for the settings' kind (openai_batch: client.py, anthropic_batch: anthropic.py)."""
    if s.kind == "anthropic_batch":
        from transforms.engines.openai_batch.anthropic import AnthropicBatchClient

        return AnthropicBatchClient(s)
    return BatchClient(s)


@dataclass(frozen=True)
class StepReport:
    """What one step did, and what still works."""

    batches: int = 0  # batches created
    submitted: int = 0  # requests in them
    collected: int = 0  # batches collected
    resubmitted: int = 0  # requests queued again
    failed: int = 0  # requests that ran out of resubmissions
    working: int = 0  # batches not collected yet (submitted, or recorded and still to submit)


def chunks(lines: list[bytes], max_requests: int, max_bytes: int) -> Iterator[list[bytes]]:
    """Lines in groups of at most `max_requests` lines and `max_bytes` bytes (newlines counted). Pure."""
    group: list[bytes] = []
    size = 0
    for line in lines:
        if group and (len(group) >= max_requests or size + len(line) + 1 > max_bytes):
            yield group
            group, size = [], 0
        group.append(line)
        size += len(line) + 1
    if group:
        yield group


def miss_reason(entry: dict[str, Any], line: dict[str, Any] | None, cancelled: bool) -> tuple[str, str]:
    """Why a request of a finished batch has no answer: (reason code, message). Pure."""
    error = (line or {}).get("error") or {}
    body = ((line or {}).get("response") or {}).get("body") or {}
    code = error.get("code") if isinstance(error, dict) else None
    message = (error.get("message") if isinstance(error, dict) else None) or str(body)[:200]
    status = entry.get("status")
    if cancelled:
        return BATCH_CANCELLED, f"batch {entry.get('batch_id')} cancelled by `pagemill cancel`"
    if code == BATCH_EXPIRED or status == "expired":  # the provider's error code is spelled as ours
        return BATCH_EXPIRED, f"batch {entry.get('batch_id')} expired before this request ran"
    why = message or "; ".join(str(e.get("message")) for e in (entry.get("errors") or []) if isinstance(e, dict))
    return BATCH_FAILED, f"batch {entry.get('batch_id')} {status}: {why or 'no answer for this request'}"[:400]


def noted(entry: dict[str, Any], batch: dict[str, Any]) -> None:
    """A batch as the provider described it (create, list or get) on its entry: its status with the files and
    counts that go with it, so that an ended status is never recorded without its output and error files."""
    errors = batch.get("errors")
    entry.update(status=batch.get("status") or "validating", request_counts=batch.get("request_counts"),
                 output_file_id=batch.get("output_file_id"), error_file_id=batch.get("error_file_id"),
                 errors=errors.get("data") if isinstance(errors, dict) else None)


class BatchDriver:
    def __init__(self, s: OpenAIBatchSettings, client: BatchClient | None = None) -> None:
        self.s = s
        self.client = client or provider(s)

    def close(self) -> None:
        self.client.close()

    def state(self) -> dict[str, Any]:
        return files.load_state(self.s.folder, self.s.run_key)

    def _save(self, state: dict[str, Any]) -> None:
        files.save_state(self.s.folder, state)

    def step(self) -> StepReport:
        state = self.state()
        held = self._recover(state)
        collected, resubmitted, failed = self._collect_finished(state)
        self._plan(state)
        batches, submitted = self._submit(state, held)
        working = sum(1 for e in state["entries"] if not e.get("collected")) + (1 if state["resubmit"] else 0)
        return StepReport(batches, submitted, collected, resubmitted, failed, working)

    def _recover(self, state: dict[str, Any]) -> set[str]:
        """Adopt the batches created for recorded entries whose id a killed launcher never wrote down; the
        fingerprints that must not be created this step (the listing failed)."""
        missing = {e["fingerprint"]: e for e in state["entries"] if not e.get("batch_id") and not e.get("collected")}
        if not missing or state["cancelled"]:
            return set()
        known = {e["batch_id"] for e in state["entries"] if e.get("batch_id")}
        try:
            found, held = self.client.find(self.s.run_key, missing, known)
        except BatchApiError as err:
            # Listing failed: creating now could submit a batch twice; the next step lists again.
            log.warning("listing batches: %s; the unrecorded batches wait for the next step", err)
            return set(missing)
        for entry, batch in found:
            log.info("batch %s of request file %s adopted (created before a kill)", batch["id"], entry["fingerprint"])
            entry.update(batch_id=batch["id"], file_id=batch.get("input_file_id"))
            noted(entry, batch)  # an adopted batch may have ended already: its files are needed
            self._save(state)
        return held

    def _collect_finished(self, state: dict[str, Any]) -> tuple[int, int, int]:
        collected = resubmitted = failed = 0
        for entry in state["entries"]:
            if not entry.get("batch_id") or entry.get("collected"):
                continue
            try:
                if entry.get("status") not in TERMINAL:
                    noted(entry, self.client.get(entry["batch_id"]))
                    self._save(state)
                if entry.get("status") in TERMINAL:
                    again, lost = self._collect(state, entry)
                    collected, resubmitted, failed = collected + 1, resubmitted + again, failed + lost
            except BatchApiError as err:
                log.warning("batch %s: %s; tried again at the next step", entry["batch_id"], err)
        return collected, resubmitted, failed

    def _collect(self, state: dict[str, Any], entry: dict[str, Any]) -> tuple[int, int]:
        ids = set(entry["custom_ids"])
        answers: dict[str, dict[str, Any]] = {}
        misses: dict[str, dict[str, Any]] = {}
        billed = {"prompt_tokens": 0, "completion_tokens": 0}
        for line in self.client.results(entry):
            cid = line.get("custom_id") if isinstance(line, dict) else None
            if cid not in ids or cid in answers:
                continue
            response = line.get("response") or {}
            body = response.get("body") if isinstance(response, dict) else None
            if isinstance(response, dict) and response.get("status_code") == 200 and isinstance(body, dict) \
                    and not line.get("error"):
                answers[cid] = body
                usage = body.get("usage") or {}
                for name in billed:
                    value = usage.get(name) if isinstance(usage, dict) else None
                    billed[name] += value if type(value) is int and value > 0 else 0
            else:
                misses[cid] = line
        out = [{"custom_id": cid, "body": body} for cid, body in answers.items()]
        again = lost = 0
        for cid in entry["custom_ids"]:
            if cid in answers:
                continue
            reason, message = miss_reason(entry, misses.get(cid), state["cancelled"])
            tries = int(state["tries"].get(cid, 0))
            if tries < self.s.max_resubmits and not state["cancelled"]:
                state["tries"][cid] = tries + 1
                state["resubmit"].append([cid, entry["fingerprint"]])
                again += 1
            else:
                out.append({"custom_id": cid, "failed": reason, "message": message})
                lost += 1
        # The results first (a kill before the state's save collects the batch again, the same way).
        files.write_lines(files.result_file(self.s.folder, entry["batch_id"]),
                          (json.dumps(line, sort_keys=True).encode() for line in out))
        entry.update(collected=True, answered=len(answers), resubmitted=again, failed=lost, billed=billed)
        self._save(state)
        log.info("batch %s %s: %d answered, %d queued again, %d failed for good", entry["batch_id"],
                 entry["status"], len(answers), again, lost)
        return again, lost

    def _plan(self, state: dict[str, Any]) -> int:
        """The queued resubmissions and the workers' spooled requests as new entries (request files written
        first, then the state); the spool files read are deleted last."""
        if state["cancelled"]:
            return 0
        lines: list[bytes] = []
        by_file: dict[str, dict[str, bytes]] = {}
        for cid, fp in state["resubmit"]:
            if fp not in by_file:
                by_file[fp] = {json.loads(line)["custom_id"]: line
                               for line in files.read_lines(files.request_file(self.s.folder, fp))}
            lines.append(by_file[fp][cid])
        known = {cid for e in state["entries"] for cid in e["custom_ids"]}
        spooled = files.matching(self.s.folder, "spool")
        for uri in spooled:
            for line in files.read_lines(uri):
                cid = json.loads(line)["custom_id"]
                if cid not in known:
                    known.add(cid)
                    lines.append(line)
        made = 0
        for group in chunks(lines, self.s.limit_requests, self.s.max_bytes):
            data = b"".join(line + b"\n" for line in group)
            fp = files.fingerprint(data + f"#{len(state['entries'])}".encode())  # unique even for equal content
            files.write_lines(files.request_file(self.s.folder, fp), group)
            state["entries"].append({"fingerprint": fp, "custom_ids": [json.loads(x)["custom_id"] for x in group],
                                     "bytes": len(data), "status": "recorded", "collected": False})
            made += 1
        if lines or spooled:
            state["resubmit"] = []
            self._save(state)
            files.delete(spooled)
        return made

    def _submit(self, state: dict[str, Any], held: set[str]) -> tuple[int, int]:
        batches = requests = 0
        for entry in state["entries"]:
            if entry.get("batch_id") or entry.get("collected") or entry["fingerprint"] in held or state["cancelled"]:
                continue
            fp = entry["fingerprint"]
            def data(fp: str = fp) -> bytes:
                return b"".join(line + b"\n" for line in files.read_lines(files.request_file(self.s.folder, fp)))

            # When it was sent: a provider without batch metadata (anthropic.py) finds it by this after a kill.
            entry.setdefault("submitting_at", dt.datetime.now(dt.UTC).isoformat())
            self._save(state)
            try:
                batch = self.client.submit(entry, data, {RUN_KEY: self.s.run_key, REQUEST_FILE: fp},
                                           lambda: self._save(state))
            except BatchApiError as err:
                log.warning("submitting request file %s: %s; tried again at the next step", fp, err)
                break
            entry.update(batch_id=batch["id"], submitted_at=dt.datetime.now(dt.UTC).isoformat())
            noted(entry, batch)
            self._save(state)
            batches, requests = batches + 1, requests + len(entry["custom_ids"])
        return batches, requests

    def cancel(self) -> list[str]:
        """Cancel the run's batches: nothing more is submitted; unsent entries fail `batch_cancelled` now, sent
        ones as their batches end. The ids of the batches asked to cancel."""
        state = self.state()
        state["cancelled"], state["resubmit"] = True, []
        self._save(state)
        asked = []
        for entry in state["entries"]:
            if entry.get("collected"):
                continue
            if not entry.get("batch_id"):
                out = [{"custom_id": cid, "failed": BATCH_CANCELLED, "message": "cancelled before it was sent"}
                       for cid in entry["custom_ids"]]
                files.write_lines(files.result_file(self.s.folder, f"unsent-{entry['fingerprint']}"),
                                  (json.dumps(line, sort_keys=True).encode() for line in out))
                entry.update(collected=True, status="cancelled", failed=len(out))
            elif entry.get("status") not in TERMINAL:
                entry["status"] = self.client.cancel(entry["batch_id"]).get("status") or "cancelling"
                asked.append(entry["batch_id"])
            self._save(state)
        return asked


def summary(state: dict[str, Any]) -> dict[str, Any]:
    """The run manifest's `batches`: each batch with its request counts as the provider reported them, and the
    run's requests submitted, answered, expired or failed and resubmitted, and the tokens billed. Pure."""
    entries = state["entries"]
    sent = [e for e in entries if e.get("batch_id")]
    return {
        "batches": [{"batch_id": e["batch_id"], "status": e.get("status"), "requests": len(e["custom_ids"]),
                     "request_counts": e.get("request_counts"), "request_file": e["fingerprint"]} for e in sent],
        "submitted": sum(len(e["custom_ids"]) for e in sent),
        "finished": sum(int(e.get("answered") or 0) for e in entries),
        "expired": sum(len(e["custom_ids"]) - int(e.get("answered") or 0) for e in sent
                       if e.get("collected") and e.get("status") == "expired"),
        "resubmitted": sum(int(n) for n in state["tries"].values()),
        "failed": sum(int(e.get("failed") or 0) for e in entries),
        "billed_prompt_tokens": sum(int((e.get("billed") or {}).get("prompt_tokens") or 0) for e in entries),
        "billed_completion_tokens": sum(int((e.get("billed") or {}).get("completion_tokens") or 0) for e in entries),
        "working": sum(1 for e in entries if not e.get("collected")),
        "cancelled": bool(state["cancelled"]),
    }
