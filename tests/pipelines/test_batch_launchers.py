"""Two launchers of one run (pipelines/run/batches.py with transforms/engines/openai_batch/lock.py): while one holds
the run's batches, a second `pagemill run` and a `pagemill cancel` exit 75 at once with a line naming the holder, and
submit, cancel or run nothing; once the holder has ended, the next launcher submits the spool exactly once."""
from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from pipelines.run.batches import TryLater, batch_waves, cancel_command
from pipelines.run.exit_codes import TRY_LATER
from schemas.layout import batch_folder
from tests.support.fake_batch_server import FakeBatches, batch_server
from transforms.engines.openai_batch import files
from transforms.engines.openai_batch.engine import batch_line
from transforms.engines.openai_batch.lock import launcher_lock
from transforms.engines.openai_batch.settings import OpenAIBatchSettings

IDS = [f"pm-{i}" for i in range(3)]


def no_pass() -> tuple[object, dict]:
    raise AssertionError("the pipeline ran under another launcher's lock")


def test_a_second_launcher_and_a_cancel_exit_75_while_the_first_holds_the_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = str(tmp_path / "out")
    fake = FakeBatches()
    with batch_server(fake) as url:
        s = OpenAIBatchSettings(endpoint=url, model="gpt-4o", folder=batch_folder(out, "default", "r1"),
                                run_key="default/r1", backoff_s=0.0, max_backoff_s=0.0)
        o = SimpleNamespace(run_id="r1", wait=False, batch_poll_s=1.0, output=out, tenant="default")
        files.write_spool(s.folder, [batch_line(cid, {"model": "gpt-4o", "messages": []}) for cid in IDS])
        with launcher_lock(s.folder):  # the first launcher
            with pytest.raises(TryLater) as later:
                batch_waves(o, s, {}, None, None, no_pass)
            assert f"pid {os.getpid()}" in str(later.value) and "another launcher" in str(later.value)
            assert cancel_command(["--output", out, "--run-id", "r1", "--endpoint", url]) == TRY_LATER
            assert "another launcher" in capsys.readouterr().err
            assert not fake.batches and not fake.received
            assert len(files.matching(s.folder, "spool")) == 1  # the spool waits for the holder
            assert not files.load_state(s.folder, "default/r1")["cancelled"]
        with pytest.raises(TryLater, match="batches working"):  # the holder has ended: this one submits
            batch_waves(o, s, {}, None, None, no_pass)
        with pytest.raises(TryLater, match="batches working"):
            batch_waves(o, s, {}, None, None, no_pass)
        assert fake.received == {cid: 1 for cid in IDS}
        assert cancel_command(["--output", out, "--run-id", "r1", "--endpoint", url]) == 0
        assert [b["status"] for b in fake.batches.values()] == ["cancelling"]
