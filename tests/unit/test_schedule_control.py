"""Who decides a model schedule's state after a deploy (flows/schedule_control.py ``decide``): the operator, except
for schedules whose target does not exist yet. tests/e2e/test_schedule_control.py runs it on a real server."""

from __future__ import annotations

import pytest

from flows.schedule_control import decide


@pytest.mark.parametrize(
    ("active", "new", "held", "target_exists", "expected"),
    [
        # The operator's choice stands while the target exists, whatever it is.
        (False, False, False, True, (False, False)),
        (True, False, False, True, (True, False)),
        # A new schedule runs once its target exists, even one a prefect file created paused.
        (True, True, False, True, (True, False)),
        (False, True, False, True, (True, False)),
        # What bootstrap paused for a missing target runs again once it exists, and leaves the record.
        (False, False, True, True, (True, False)),
        # A missing target holds every schedule that would run, and keeps the operator's own pause as it is.
        (True, False, False, False, (False, True)),
        (True, True, False, False, (False, True)),
        (False, False, True, False, (False, True)),
        (False, False, False, False, (False, False)),
    ],
)
def test_bootstrap_changes_only_what_it_paused_or_what_cannot_run(active, new, held, target_exists, expected):
    decision = decide(active, new, held, target_exists)
    assert (decision.active, decision.held) == expected
