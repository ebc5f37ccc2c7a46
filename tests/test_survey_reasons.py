"""The exporter survey groups refusals by their text without node and value names."""

from __future__ import annotations

import pytest
from tools.exporters.survey import reason_key


@pytest.mark.parametrize(
    ("reason", "key"),
    [
        (
            "Loop 'while/body:0': the trip count is X's length, the guard's stack",
            "Loop '…': the trip count is X's length, the guard's stack",
        ),
        ('GRU "gru_1": hidden 64 at seq 8', "GRU '…': hidden N at seq N"),
        ("reads model/lstm/transpose:0[1] twice", "reads … twice"),
    ],
)
def test_reason_key_masks_names_not_apostrophes(reason: str, key: str) -> None:
    assert reason_key(reason) == key


def test_reasons_differing_only_in_names_share_a_key() -> None:
    first = "Loop 'a': the Loop runs an LSTM cell, but X's length is 3"
    second = "Loop 'b/c': the Loop runs an LSTM cell, but X's length is 7"
    assert reason_key(first) == reason_key(second)
