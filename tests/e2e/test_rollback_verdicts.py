"""rollback-model never lands on a revision a promotion found bad.

A candidate that failed verification or breached the SLO stays Ready in Cloud Run (it started), so "the newest ready
revision before the serving one" can be exactly the revision an incident must not go back to (issue 25: revision A
promoted, B failed verification, C promoted; rollback sent 100 % to B).
"""

from __future__ import annotations

import itertools

import pytest

from flows.rollback import rollback_model
from tasks.common import clients
from tests.support.promotion import promote, run_service

pytestmark = [
    pytest.mark.prefect,
    # Zero-downtime re-promotions put each candidate beside the serving revision (64 GiB of a new project's 40): the
    # verdicts are what is tested here, with the quota a team delivering this way requested.
    pytest.mark.usefixtures("raised_quota"),
]
_ids = itertools.count()


def revisions(flow_env, service: str) -> dict[str, bool]:
    """Each revision of the service: whether Cloud Run has it Ready."""
    parent = run_service(flow_env, service).name
    return {
        r.name.rsplit("/", 1)[1]: any(
            c.type_ == "Ready" and c.state.name == "CONDITION_SUCCEEDED" for c in r.conditions
        )
        for r in clients.run_revisions(flow_env).list_revisions(parent=parent)
    }


def test_rollback_skips_a_revision_that_failed_verification_and_refuses_it_by_name(sb, flow_env):
    service = f"verdicts-{next(_ids)}"
    a = promote(service).serving_revision
    sb.run("POST", "/faults", json={"service": service, "faults": {"served_model_name": "not-the-model"}})
    with pytest.raises(Exception, match=r"but not 'sandbox/tiny-chat': wrong model or name"):
        promote(service, revision="dev")
    c = promote(service, revision="v1.0").serving_revision
    ready = revisions(flow_env, service)
    (b,) = set(ready) - {a, c}
    assert ready[b], "the abandoned candidate is Ready in Cloud Run: only the pipeline knows it is bad"

    back = rollback_model(service=service)
    assert (back.from_revision, back.to_revision) == (c, a)

    # Named, it is refused, saying why and how to insist; with force it is served.
    refused = rf"to_revision: revision '{b}' of {service} failed verification \(recorded on the service\); set force"
    with pytest.raises(Exception, match=refused):
        rollback_model(service=service, to_revision=b)
    forced = rollback_model(service=service, to_revision=b, force=True)
    assert forced.to_revision == b
    assert [(s.revision, s.percent) for s in run_service(flow_env, service).traffic_statuses if s.percent] == [(b, 100)]


def test_a_revision_rolled_back_from_is_not_rolled_back_to(flow_env):
    service = f"verdicts-{next(_ids)}"
    a = promote(service).serving_revision
    b = promote(service, revision="dev").serving_revision
    assert rollback_model(service=service).to_revision == a  # b is now recorded as rolled back
    c = promote(service, revision="v1.0").serving_revision
    back = rollback_model(service=service)
    assert (back.from_revision, back.to_revision) == (c, a), f"went back to {back.to_revision}, not past {b}"


def test_a_promotion_run_again_after_its_rollback_is_refused_naming_the_verdict(flow_env):
    """Issue 33: promote v1.0, roll it back, run the same promotion again (CI, the UI's "run again"): the rolled-back
    revision went back to 100 % silently. Its candidate is that very revision, so the run is refused without force."""
    from tests.support.artifacts import artifact

    service = f"verdicts-{next(_ids)}"
    a = promote(service).serving_revision
    b = promote(service, revision="v1.0").serving_revision
    back = rollback_model(service=service)
    assert (back.from_revision, back.to_revision) == (b, a)

    verdict = (rf"revision {b} of {service} was rolled back at \d{{4}}-\d\d-\d\dT\d\d:\d\d:\d\dZ by rollback-model run "
               r"'[^']+' \([0-9a-f-]{36}\), and it is this run's candidate .*set force=true")  # fmt: skip
    with pytest.raises(Exception, match=verdict):
        promote(service, revision="v1.0")
    assert [(s.revision, s.percent) for s in run_service(flow_env, service).traffic_statuses if s.percent] == [(a, 100)]
    report = artifact(f"promotion-{service}")
    assert f"revision {b} of {service} was rolled back at" in report and "rollback-model run" in report

    # With force it is deployed, verified and promoted again, and the report says what was overridden.
    forced = promote(service, revision="v1.0", force=True)
    assert (forced.outcome, forced.serving_revision) == ("promoted", b)
    assert [n for n in forced.notes if n.startswith(f"force: revision {b} of {service} was rolled back")]
    assert "| note | force: revision" in artifact(f"promotion-{service}")
