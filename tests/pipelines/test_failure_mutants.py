"""run_failure's branches that the one-line test in tests/transforms/store/test_compaction.py leaves open
(mutants of it survived `make mutate`, docs/development.md "Mutation score"): a cause without a context, an
OSError without a file name, a storage error named only by its errno or only by its words, a worker's traceback
with more than two exception lines, the 300-character cut, an exception without a message."""
from __future__ import annotations

import errno
import os

import pytest

from pipelines.run.failure import run_failure

NO_SPACE = "no space left on the output's storage"


def test_a_cause_set_without_a_context_is_followed() -> None:
    """`raise X from Y` outside an except block (or a runner that only sets __cause__): Y is still the root."""
    wrapped = RuntimeError("the write step failed")
    wrapped.__cause__ = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    assert wrapped.__context__ is None
    assert run_failure(wrapped) == NO_SPACE


def test_a_storage_error_without_a_file_name_adds_no_brackets() -> None:
    assert run_failure(OSError(errno.EROFS, os.strerror(errno.EROFS))) == "the output's storage is read-only"
    named = OSError(errno.EDQUOT, os.strerror(errno.EDQUOT), "/out/ledger/part-1.parquet")
    assert run_failure(named) == "the output's storage quota is exhausted (/out/ledger/part-1.parquet)"


@pytest.mark.parametrize("text", [f"write failed: [Errno {errno.ENOSPC}] (message cut)",
                                  f"write failed: {os.strerror(errno.ENOSPC)}"], ids=["errno-only", "words-only"])
def test_a_storage_error_in_text_is_found_by_its_errno_or_by_its_words(text: str) -> None:
    assert run_failure(RuntimeError(text)) == NO_SPACE


def test_the_last_of_three_exception_lines_is_the_one_reported() -> None:
    trace = RuntimeError("Traceback (most recent call last):\n  File \"a.py\"\nKeyError: 'first'\n\n"
                         "Traceback (most recent call last):\n  File \"b.py\"\nValueError: second\n\n"
                         "Traceback (most recent call last):\n  File \"c.py\"\nTypeError: third\n")
    assert run_failure(trace) == "TypeError: third"


def test_a_long_message_is_cut_at_300_characters() -> None:
    # 300 = the cut the docstring's "one line" promises; "RuntimeError: " is 14 characters of it.
    assert run_failure(RuntimeError("x" * 400)) == "RuntimeError: " + "x" * 286
    trace = RuntimeError("Traceback (most recent call last):\n  File \"a.py\"\nValueError: " + "y" * 400 + "\n")
    assert run_failure(trace) == "ValueError: " + "y" * 288


def test_an_exception_without_a_message_is_named_by_its_type_alone() -> None:
    assert run_failure(LookupError()) == "LookupError: "
