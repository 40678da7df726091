"""promote-model's quality gate step and the abandon path it shares with verification (flows/promote.py).

After the candidate's verification and before any traffic moves, the quality gate (tasks/quality/gate.py) asks the
candidate and the serving revision the quality set's prompts; a refused candidate is abandoned exactly like one that
failed verification, its verdict on the service ``failed-quality`` (so no rollback lands on it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from blocks.profile import ServingProfile
from blocks.source import ModelSource
from flows.delivery import DeliveryRun
from flows.replace import Stopped, resume_after_failed_replace
from tasks.common.logs import run_logger
from tasks.deploy.cloudrun import run_abandon_candidate
from tasks.deploy.probe import VerifyOptions
from tasks.quality.gate import QualityRefused, run_quality_gate
from tasks.quality.spec import QualitySet, QualitySpec, resolve_quality
from tasks.quality.verdict import GateResult
from tasks.report.report import PromotionReport


def quality_set(spec: dict, given: QualitySpec | None, spec_file: str | None) -> QualitySet | None:
    """The run's quality set (the parameter over the model file's), its JSONL file read beside the model file (in
    deployments/ without one): checked whole before any cloud write."""
    folder = Path(spec_file).parent if spec_file else Path.cwd() / "deployments"
    if given is not None:
        return resolve_quality(given, folder, "quality")
    return resolve_quality(spec.get("quality"), folder, f"{spec_file}: quality")


def judge_answers(
    report: PromotionReport, run: DeliveryRun, source: ModelSource, verify: VerifyOptions | None,
    stopped: Stopped | None,
) -> None:  # fmt: skip
    """The quality gate (its own task run): the report gets its table, pass or fail."""
    quality = run.delivery.quality
    assert quality is not None  # the caller runs the gate only with a quality set
    candidate = run.candidate
    compare = stopped is None and bool(candidate.previous_traffic)
    if compare:  # tagging the serving revision is a write to the service: fenced like every other
        run.fenced(candidate.left_serving, "quality gate")
    timeout = (verify or VerifyOptions()).request_timeout_s
    try:
        report.quality = run_quality_gate(run.target, candidate, source.served_model_name, quality, timeout, compare)
    except QualityRefused as exc:
        report.quality = exc.result
        raise


@contextlib.contextmanager
def abandoned_on_failure(
    report: PromotionReport, run: DeliveryRun, stopped: Stopped | None, profile: ServingProfile
) -> Iterator[None]:
    """A failure inside abandons the candidate before any traffic moves (with the replace rollout the old revision
    serves again), its verdict ``failed-quality`` when the quality gate refused it, else ``failed-verification``."""
    candidate = run.candidate
    try:
        yield
    except Exception as exc:
        # The failure is the run's story: a failure to abandon is logged beside it, and a replace rollout's service
        # never stays at manual 0 (resume_after_failed_replace logs its own failure).
        verdict = "failed-quality" if isinstance(exc, QualityRefused) else "failed-verification"
        try:
            run.fenced(candidate.left_serving, "abandon the candidate")
            run_abandon_candidate(run.target, run.service_id, candidate, verdict)
        except Exception as abandon_error:
            run_logger().error("the candidate %s could not be abandoned: %s", candidate.revision, abandon_error)
        finally:
            if stopped is not None:
                resume_after_failed_replace(report, run.target, run.service_id, stopped, profile, run.lock)
        raise


def quality_payload(result: GateResult | None) -> dict | None:
    """The gate's scores for the promotion's event (automations can say them in a notification)."""
    if result is None:
        return None
    payload = {"passed": result.passed, "candidate_score": result.candidate_score,
               "serving_score": result.serving_score, "agreement": result.agreement}  # fmt: skip
    if result.perplexity is not None:
        serving = result.perplexity.serving
        payload["perplexity"] = {"candidate": result.perplexity.candidate.value,
                                 "serving": serving.value if serving else None}  # fmt: skip
    return payload
