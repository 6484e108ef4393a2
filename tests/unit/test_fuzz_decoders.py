"""Every consumer decoder under property-based fuzzing (issue 36, finding 3): arbitrary
bytes and structure-aware mutations of valid records either decode or are unreadable
records with a reason, in bounded time — a few hundred derandomized examples per decoder
(the same every run); ``bench/fuzz.py`` runs the same properties
(``tests/fuzz_properties.py``) with many more."""

from __future__ import annotations

import pytest

from tests.fuzz_properties import Target, targets

EXAMPLES = 300


@pytest.mark.parametrize("target", targets(), ids=lambda t: t.name)
def test_every_record_decodes_or_is_unreadable_with_a_reason(target: Target) -> None:
    stats = target.run(EXAMPLES)
    assert stats.examples == EXAMPLES
    # The mutations stay close enough to valid records that some still decode, and the
    # hostile ones are refused: both sides of the property are exercised.
    assert stats.decoded > 0
    assert stats.refused > 0
