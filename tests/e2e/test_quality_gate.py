"""The quality gate (issue 37): before any traffic moves, the candidate and the serving revision answer the model
file's quality set side by side; a candidate that starts, answers 200s and is wrong is refused.

The stand-in answers what its model's config.json says it knows (sandbox/tiny-chat knows deployments/sandbox/
tiny-chat.yaml's prompts), and with the fault ``wrong_answers`` it answers fluently and knows nothing. The quality
set is given as promote-model's ``quality`` parameter, as the model file has it.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import yaml
from google.api_core import exceptions as gexc

from flows.rollback import rollback_model
from tasks.checks.findings import PreflightError
from tasks.common.naming import SERVING_TAG
from tasks.deploy.verdicts import ANNOTATION
from tests.support.artifacts import artifact
from tests.support.promotion import promote, run_service

pytestmark = [
    pytest.mark.prefect,
    # Zero-downtime re-promotions put each candidate beside the serving revision: the gate is what is tested here.
    pytest.mark.usefixtures("raised_quota"),
]
MODEL_FILE = Path(__file__).resolve().parents[2] / "deployments" / "sandbox" / "tiny-chat.yaml"
QUALITY = yaml.safe_load(MODEL_FILE.read_text())["quality"]
WRONG = {"wrong_answers": True}
_ids = itertools.count()


def traffic(flow_env, service: str) -> list[tuple[str, int, str]]:
    return [(s.revision, s.percent, s.tag) for s in run_service(flow_env, service).traffic_statuses]


def test_a_first_deploy_is_judged_against_the_floor_alone(sb, flow_env, grants_propagated):
    # grants_propagated: the fault goes to the service's first revision, which is then the candidate (not one that
    # failed to mount the bucket a moment after this run granted its account access, and was deployed again).
    service = f"quality-first-{next(_ids)}"
    sb.run("POST", "/faults", json={"service": service, "faults": WRONG})
    refused = (r"quality gate refused the candidate: below min_score 0\.75; perplexity \d+ above max 2\.000: "
               r"candidate \S+ scored 0\.00 \(0/4\); no serving revision answered \(a first deploy\): "
               r"floor only; perplexity candidate \d+$")  # fmt: skip
    with pytest.raises(Exception, match=refused):
        promote(service, quality=QUALITY)
    assert "NOT promoted: the quality gate step failed" in artifact(f"promotion-{service}")
    with pytest.raises(gexc.NotFound):
        run_service(flow_env, service)  # nothing served before it, and nothing serves now

    report = promote(service, quality=QUALITY)
    assert report.outcome == "promoted" and report.quality is not None
    assert (report.quality.candidate_score, report.quality.serving_score) == (1.0, None)
    assert report.quality.requests == 4 + 1 and "floor only" in report.quality.reason  # the prompts, the reference
    assert report.quality.perplexity.candidate.value < 1.01, report.quality.reason


def test_a_wrong_candidate_is_refused_before_any_traffic_moves_and_a_right_one_is_promoted(
    sb, flow_env, asserting_events_worker
):
    service = f"quality-{next(_ids)}"
    first = promote(service, quality=QUALITY).serving_revision
    before = traffic(flow_env, service)

    sb.run("POST", "/faults", json={"service": service, "faults": WRONG})
    with pytest.raises(Exception) as refused:
        promote(service, revision="dev", quality=QUALITY)
    said = str(refused.value)
    assert said.startswith("quality gate refused the candidate: below min_score 0.75; more than max_drop 0.00 below")
    assert f"scored 0.00 (0/4), serving {first} scored 1.00 (4/4)" in said
    assert traffic(flow_env, service) == before, "traffic never moved, and the serving tag is gone"
    verdicts = json.loads(run_service(flow_env, service).annotations[ANNOTATION])
    (bad,) = [name for name, record in verdicts.items() if record["verdict"] == "failed-quality"]
    report = artifact(f"promotion-{service}")
    for expected in ("## Quality gate", "| candidate score | 0.00 (min_score 0.75) |", "| gate cost | 10 requests in",
                     f"| serving score | 1.00 ({first}", "| What is 7 times 6? Answer with the number only. | FAIL: `",
                     "| pass: `42` |", f"{first} 100 %"):  # fmt: skip
        assert expected in report, expected
    asserting_events_worker.drain()
    failed = [e for e in asserting_events_worker._client.events if e.event == "model.promotion_failed"]
    scores = failed[-1].payload["quality"]
    assert {k: scores[k] for k in ("passed", "candidate_score", "serving_score", "agreement")} == {
        "passed": False, "candidate_score": 0.0, "serving_score": 1.0, "agreement": None}  # fmt: skip
    # It knows no answer, and the text the model knows by heart reads to it as any other text would.
    assert scores["perplexity"]["candidate"] > 100 and scores["perplexity"]["serving"] < 1.01, scores
    assert "| perplexity | candidate " in report and "(max_ratio 1.1; max 2;" in report

    # The same weights on a new load mode (a flags change): the answers must agree too, and they do.
    second = promote(service, load_mode="runai-streamer", quality=QUALITY)
    assert second.outcome == "promoted" and second.serving_revision not in (first, bad)
    assert second.quality is not None and second.quality.same_weights and second.quality.agreement == 1.0
    assert (second.quality.candidate_score, second.quality.serving_score) == (1.0, 1.0)
    assert not [tag for _, _, tag in traffic(flow_env, service) if tag == SERVING_TAG]
    # The refused candidate is Ready in Cloud Run; a rollback passes over it to the first revision.
    assert rollback_model(service=service).to_revision == first


def test_a_quality_set_too_large_for_the_verify_window_is_refused_in_preflight(sb, flow_env):
    service = f"quality-budget-{next(_ids)}"
    since = sb.last_request_seq()
    # 48 x 2 s to a first token + 480 tokens at 10/s, then the perplexity text: 2 s and its rank kernel's compile, 20 s
    many = {**QUALITY, "prompts": QUALITY["prompts"] * 12}
    with pytest.raises(PreflightError, match="quality"):
        promote(service, quality=many)
    report = artifact(f"promotion-{service}")
    assert (
        "error: `quality`: quality: 48 prompts of up to 480 tokens in all and the perplexity text may take 166 s"
        in report
    ), report
    writes = [r for r in sb.requests(since=since) if r["method"] in ("POST", "PUT", "PATCH", "DELETE")
              and r["server"] in ("control", "gcs")]  # fmt: skip
    assert writes == [], "refused before any cloud write"
