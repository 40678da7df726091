"""The watch waits only when it can judge (issue 33: a first deploy of a 4 MB model took 785 s on bootstrap's target,
780 s of it a watch that ended "too little traffic ... not judged", logged as "after 660 s of 600 s").

A first deploy has no revision to go back to: it is not watched. A re-promotion of a service whose serving revision
had too little traffic lately says so before anything waits, then skips the watch or sends the verify step's own
requests (the profile's watch_without_traffic). A watch that runs logs its plan first: its periods, Monitoring's delay
and the time it ends by."""

from __future__ import annotations

import itertools
import re

import pytest

from blocks import ServingProfile
from tests.support.artifacts import artifact
from tests.support.promotion import promote_watched as promote
from tests.support.run_log import run_logs

pytestmark = pytest.mark.prefect
_ids = itertools.count()
SLO = {"max_error_ratio": 0.02, "max_p95_ms": "off", "min_requests": 5}


def test_a_first_deploy_is_not_watched_and_the_report_says_why(flow_env):
    service = f"plan-first-{next(_ids)}"
    with run_logs() as log:
        report = promote(service, watch={"samples": 3, **SLO})
    assert report.outcome == "promoted"
    assert report.delivery == []  # no watch step: nothing to go back to, nothing it could change
    assert [n for n in report.notes if n.startswith("watch skipped: a first deploy has no earlier revision")]
    assert "judging" not in log.text() and "monitoring_watch_revision" not in log.text()
    assert "| note | watch skipped: a first deploy" in artifact(f"promotion-{service}")
    # The run's last words say what it did (a worker's log otherwise ends "Finished in state Completed()").
    outcome = [line for line in log.lines if line.startswith(f"{service}: promoted; traffic ")]
    assert outcome and f"{report.serving_revision} 100 %; URL http" in outcome[-1], log.lines[-5:]
    assert f"revision {report.serving_revision} (was nothing); watch skipped: a first deploy" in outcome[-1]
    assert log.errors == []  # e.g. no "Error encountered when computing cache key" from the deploy task


@pytest.mark.usefixtures("raised_quota")  # a canary of a re-promotion: the candidate beside the serving revision
def test_a_quiet_service_is_promoted_without_a_watch_that_could_judge_nothing(flow_env):
    service = f"plan-quiet-{next(_ids)}"
    old = promote(service).serving_revision
    with run_logs() as log:
        report = promote(service, revision="dev", canary=[10, 50], watch={"samples": 3, **SLO})
    assert report.outcome == "promoted" and report.serving_revision != old
    assert report.delivery == []  # neither the canary steps nor the watch at 100 %
    (note,) = [n for n in report.notes if n.startswith("watch skipped:")]
    # What it served is the first deploy's verify requests, no users' traffic.
    quiet = rf"{old} 100 % served (\d) requests in the last \d+ s, fewer than the watch's min_requests \(5\)"
    served = re.search(quiet, note)
    assert served and int(served[1]) < 5, note
    assert "watch_without_traffic: skip" in note
    assert "judging" not in log.text()


@pytest.mark.usefixtures("raised_quota")  # a watched re-promotion: the candidate beside the serving revision
def test_a_quiet_service_whose_profile_asks_for_load_is_watched_on_the_verify_request(flow_env):
    service = f"plan-load-{next(_ids)}"
    profile = f"plan-load-profile-{next(_ids)}"
    ServingProfile.preset("l4", watch_without_traffic="load").save(profile, overwrite=True)
    promote(service, profile=profile)
    with run_logs() as log:
        report = promote(service, profile=profile, revision="dev", watch={"samples": 2, **SLO})
    assert report.outcome == "promoted"
    (step,) = report.delivery
    assert step.step == "watch 100 %" and step.verdict == "held" and step.requests >= 5, step
    assert [n for n in report.notes if n.startswith("watch loaded:")]
    text = log.text()
    assert re.search(r"sent 5 chat completions to \S+ \(5 answered 200\)", text), text[-3000:]
    # The plan comes first, with its end time; no progress line counts past its window.
    plan = (
        r"watch 100 %: judging \S+ over 2 sampling periods of [\d.]+ s \([\d.]+ s\); Cloud Monitoring shows a "
        r"period up to [\d.]+ s after it ends, so the step ends by \d\d:\d\d:\d\d UTC"
    )
    assert re.search(plan, text), text[-3000:]
    assert not re.search(r"after \d+ s of \d+ s", text)
    for elapsed, window in re.findall(r"\(([\d.]+) s of the ([\d.]+) s window\)", text):
        assert float(elapsed) <= float(window)  # rounded to 0.1 s: at most equal
