"""The value normaliser (transforms/model/values.py): the printed forms of money, numbers and dates."""
from __future__ import annotations

from decimal import Decimal

import pytest

from transforms.model.values import number_of, numbers, printed_forms, tokens


@pytest.mark.parametrize("printed", ["1,717.44", "£1717.44", "1717.44", "1.717,44", "EUR 1717,44", "$1,717.440"])
def test_money_is_read_by_value_in_its_printed_forms(printed: str) -> None:
    (token,) = [t for t in tokens(printed) if t[0].isdigit()]
    assert Decimal("1717.44") in numbers(token)


def test_a_number_is_not_another() -> None:
    assert Decimal("1717.44") not in numbers("1717.45")
    assert Decimal("12.42") not in {n for t in tokens("12:42") for n in numbers(t)}  # a time is two numbers
    assert number_of(8.55) == Decimal("8.55") and number_of(3) == Decimal(3) and number_of(float("nan")) is None


@pytest.mark.parametrize("printed", ["25/12/2018", "25.12.2018", "2018-12-25", "12/25/2018", "Dec 25, 2018",
                                     "25 December 2018", "December 25, 2018", "25-Dec-2018", "25/12/18",
                                     "25 dec 2018"])
def test_a_date_is_found_in_its_everyday_spellings(printed: str) -> None:
    assert tokens(printed) in printed_forms("2018-12-25")


@pytest.mark.parametrize("printed", ["26/12/2018", "25/11/2018", "Dec 25, 2019", "2018-12-52"])
def test_another_date_is_not_that_date(printed: str) -> None:
    assert tokens(printed) not in printed_forms("2018-12-25")


def test_text_is_compared_by_tokens_whatever_the_punctuation_and_case() -> None:
    assert tokens("Receipt #4711") == tokens("RECEIPT 4711") == ["receipt", "4711"]
    assert printed_forms("Contoso Print & Co") == [["contoso", "print", "co"]]
