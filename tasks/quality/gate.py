"""The quality gate: before any traffic moves, the candidate and the serving revision answer the quality set's
prompts through their tag URLs, side by side, at temperature 0, and score the reference text's perplexity when the
set has one (tasks/quality/perplexity.py); tasks/quality/verdict.py judges them.

The serving revision has no URL of its own while it takes traffic: the gate tags it ``serving`` (a Cloud Run revision
tag gives a revision its own URL, "to test a revision" (docs "Manage revisions"); a tag may name any revision, as
`gcloud run services update-traffic --update-tags TAG=REVISION` does). Only the tags change, not the split; the next
traffic write (a canary step, the promotion, or the abandon of a refused candidate) drops the tag again.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
from google.cloud import run_v2
from prefect import task
from pydantic import BaseModel, SecretStr

from blocks.target import GcpTarget
from tasks.common import clients
from tasks.common.gcp import GCP_RETRY, gcp_errors
from tasks.common.logs import run_logger
from tasks.common.naming import CANDIDATE_TAG, SERVING_TAG
from tasks.deploy.cloudrun import BY_REVISION, Candidate, service_path, update_fields
from tasks.quality.perplexity import Measured, measure
from tasks.quality.spec import QualityPrompt, QualitySet
from tasks.quality.verdict import Answer, GateResult, judge

# The labels every revision the pipeline deploys carries (tasks/deploy/render.service_labels): the model and the
# commit its weights were staged from. Weights are staged once per commit (tasks/weights/staging.commit_prefix), so
# equal labels mean the very same staged files.
WEIGHTS_LABELS = ("hf-model", "hf-commit")


class Examined(BaseModel):
    """What one revision said: its answers and its perplexity of the reference text (when the set has one)."""

    answers: list[Answer]
    perplexity: Measured | None = None

    @property
    def requests(self) -> int:
        return len(self.answers) + (self.perplexity is not None)


class QualityRefused(RuntimeError):
    """The candidate's answers did not meet the quality set: the message names the gate and both scores."""

    def __init__(self, result: GateResult) -> None:
        super().__init__(result.reason)
        self.result = result


def serving_revision(candidate: Candidate) -> str | None:
    """The revision the candidate is judged against: the one with the largest share of traffic before it."""
    serving = [(percent, revision) for revision, percent in candidate.previous_traffic if percent]
    return max(serving)[1] if serving else None


def tag_serving(target: GcpTarget, service_id: str, candidate: Candidate, revision: str) -> str:
    """The ``serving`` tag on ``revision`` (the split as the deploy left it, the candidate keeping its own tag at
    0 %); its tag URL."""
    traffic = [run_v2.TrafficTarget(type_=BY_REVISION, revision=name, percent=percent,
                                    tag=SERVING_TAG if name == revision else "")
               for name, percent in candidate.previous_traffic]  # fmt: skip
    traffic.append(run_v2.TrafficTarget(type_=BY_REVISION, revision=candidate.revision, percent=0, tag=CANDIDATE_TAG))
    with gcp_errors("run", "roles/run.developer", f"tagging {revision} for the quality gate", target):
        service = update_fields(target, run_v2.Service(name=service_path(target, service_id), traffic=traffic),
                                ["traffic"])  # fmt: skip
    return next(s.uri for s in service.traffic_statuses if s.tag == SERVING_TAG)


def same_weights(target: GcpTarget, service_id: str, first: str, second: str) -> bool:
    """Whether two revisions serve the same staged weights (their model and commit labels)."""
    revisions = clients.run_revisions(target)
    with gcp_errors("run", "roles/run.viewer", f"reading revisions {first} and {second}", target):
        labels = [revisions.get_revision(name=f"{service_path(target, service_id)}/revisions/{name}",
                                         retry=GCP_RETRY).labels for name in (first, second)]  # fmt: skip
    return all(labels[0].get(key) and labels[0].get(key) == labels[1].get(key) for key in WEIGHTS_LABELS)


def ask(client: httpx.Client, served_name: str, prompts: list[QualityPrompt]) -> list[Answer]:
    """Each prompt as one user message at temperature 0, one request after the other; an answer that is not a 200
    is recorded as such (it fails its prompt), never raised."""
    answers = []
    for prompt in prompts:
        body = {"model": served_name, "messages": [{"role": "user", "content": prompt.prompt}],
                "max_tokens": prompt.max_tokens, "temperature": 0}  # fmt: skip
        try:
            response = client.post("/v1/chat/completions", json=body)
        except httpx.HTTPError as exc:
            answers.append(Answer(error=f"no answer ({type(exc).__name__})"))
            continue
        if response.status_code != 200:
            answers.append(Answer(error=f"HTTP {response.status_code}"))
            continue
        try:
            data = response.json()
            text = data["choices"][0]["message"]["content"] or ""
            tokens = int(data.get("usage", {}).get("completion_tokens", 0))
        except (ValueError, KeyError, IndexError, TypeError):
            answers.append(Answer(error="not an OpenAI chat completion"))
            continue
        answers.append(Answer(text=text, tokens=tokens))
    return answers


def examine(url: str, token: SecretStr, served_name: str, quality: QualitySet, timeout_s: float) -> Examined:
    """One revision's answers to the quality set and, with a reference text, its perplexity of it."""
    headers = {"Authorization": f"Bearer {token.get_secret_value()}"}
    with httpx.Client(base_url=url, headers=headers, timeout=timeout_s) as client:
        answers = ask(client, served_name, quality.prompts)
        if quality.perplexity is None:
            return Examined(answers=answers)
        return Examined(answers=answers, perplexity=measure(client, served_name, quality.perplexity.text))


def quality_gate(
    target: GcpTarget, candidate: Candidate, served_name: str, quality: QualitySet, timeout_s: float,
    compare: bool = True,
) -> GateResult:  # fmt: skip
    """The quality set asked of the candidate and, beside it, of the serving revision (``compare``: it runs; a
    replace rollout stopped it); raises QualityRefused naming the gate and both scores when the candidate fails."""
    log = run_logger()
    service_id = candidate.service.rsplit("/", 1)[-1]
    token = clients.identity_token(target, candidate.service_url)  # a token for the service URL opens its tag URLs
    against = serving_revision(candidate) if compare and not candidate.first_deploy else None
    note = None if against or candidate.first_deploy else "the replace rollout stopped the serving revision"
    urls = [candidate.url]
    same = False
    if against is not None:
        urls.append(tag_serving(target, service_id, candidate, against))
        same = same_weights(target, service_id, candidate.revision, against)
    started = time.monotonic()
    with ThreadPoolExecutor(len(urls)) as pool:  # both revisions at once: the gate costs one revision's time
        seen = list(pool.map(lambda url: examine(url, token, served_name, quality, timeout_s), urls))
    seconds = time.monotonic() - started
    theirs = seen[1] if against else None
    perplexity = None
    if seen[0].perplexity is not None:
        perplexity = (seen[0].perplexity, theirs.perplexity if theirs else None)
    result = judge(quality, candidate.revision, seen[0].answers, against, theirs.answers if theirs else None, same,
                   note, perplexity)  # fmt: skip
    result.requests, result.seconds = sum(s.requests for s in seen), round(seconds, 2)
    log.info("%s (%d requests, %.1f s)", result.reason, result.requests, result.seconds)
    if not result.passed:
        raise QualityRefused(result)
    return result


run_quality_gate = task(name="quality gate")(quality_gate)
