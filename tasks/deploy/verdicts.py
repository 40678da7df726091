"""What the pipeline found of each revision it deployed, kept on the service, so that a rollback never lands on one
that failed.

A candidate that failed verification or the quality gate, or breached the SLO and was rolled back, stays Ready in
Cloud Run: it is a revision that started. Only the pipeline knows it is bad. A revision's own labels and annotations
cannot change after it is created (they come from the template), so the verdicts live on the service, in one
annotation: a JSON object ``{revision: verdict}``. Updating service annotations alone makes no new revision (run.v2:
only template changes do). The newest ``MAX_VERDICTS`` are kept: annotation values are limited in size, and rollbacks
look back a few revisions, not hundreds.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Literal, NamedTuple

from google.cloud import run_v2
from google.protobuf import field_mask_pb2
from prefect.runtime import flow_run

from blocks.target import GcpTarget
from tasks.common import clients
from tasks.common.gcp import GCP_RETRY, wait_for

ANNOTATION = "hf-cloudrun-pipeline.dev/revision-verdicts"
MAX_VERDICTS = 50
Verdict = Literal["verified", "failed-verification", "failed-quality", "rolled-back"]
BAD: frozenset[str] = frozenset({"failed-verification", "failed-quality", "rolled-back"})


BAD_WORDS = {
    "failed-verification": "failed verification",
    "failed-quality": "failed the quality gate",
    "rolled-back": "was rolled back",
}


class Record(NamedTuple):
    verdict: str
    at: str = ""  # ISO 8601, UTC
    run: str = ""  # the flow run that gave it: "rollback-model run 'name' (id)"

    def said(self) -> str:
        """The verdict as a sentence's end: "was rolled back at 2026-12-03T10:00:00Z by rollback-model run 'x' (id)"."""
        words = BAD_WORDS.get(self.verdict, f"was found {self.verdict}")
        return words + (f" at {self.at}" if self.at else "") + (f" by {self.run}" if self.run else "")


def records(service: run_v2.Service) -> dict[str, Record]:
    """The verdicts recorded on ``service`` (an unreadable annotation, edited by hand say, records none)."""
    try:
        found = json.loads(service.annotations.get(ANNOTATION, "{}"))
    except ValueError:
        return {}
    if not isinstance(found, dict):
        return {}
    kept = {}
    for revision, value in found.items():
        if isinstance(value, dict) and isinstance(value.get("verdict"), str):
            kept[str(revision)] = Record(value["verdict"], str(value.get("at", "")), str(value.get("run", "")))
        elif isinstance(value, str):
            kept[str(revision)] = Record(value)
    return kept


def read(service: run_v2.Service) -> dict[str, str]:
    """Each revision's verdict alone."""
    return {revision: r.verdict for revision, r in records(service).items()}


def _this_run() -> str:
    """The flow run recording a verdict, as an operator finds it in the UI; empty outside a flow run."""
    if not flow_run.id:
        return ""
    return f"{flow_run.flow_name} run '{flow_run.name}' ({flow_run.id})"


def record(target: GcpTarget, service_name: str, revision: str, verdict: Verdict) -> None:
    """Record ``verdict`` for ``revision`` on the service (its other annotations kept), with when and by which run.
    Called under the service lock, like every other change the pipeline makes to the service."""
    services = clients.run_services(target)
    current = services.get_service(name=service_name, retry=GCP_RETRY)
    found = records(current)
    if revision in found and found[revision].verdict == verdict:
        return
    found.pop(revision, None)
    at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    found[revision] = Record(verdict, at, _this_run())
    kept = {name: r._asdict() for name, r in list(found.items())[-MAX_VERDICTS:]}
    annotations = {**dict(current.annotations), ANNOTATION: json.dumps(kept, separators=(",", ":"))}
    operation = services.update_service(
        service=run_v2.Service(name=service_name, annotations=annotations),
        update_mask=field_mask_pb2.FieldMask(paths=["annotations"]),
        retry=GCP_RETRY,
    )
    wait_for(operation, clients.operation_polling(target))


class CandidateRefused(RuntimeError):
    """This run's candidate is a revision the pipeline already found bad: promoting it again needs ``force``."""


def check_candidate(found: dict[str, Record], service_id: str, revision: str, force: bool) -> str | None:
    """Refuse ``revision`` (the revision this run's deploy would take: same weights, image and profile, so the same
    name) when a verdict found it bad, unless ``force``; with force, the line that says what was overridden. A rerun
    of a promotion (CI, the UI's "run again") would otherwise send traffic back to what a rollback took it from."""
    record = found.get(revision)
    if record is None or record.verdict not in BAD:
        return None
    said = f"revision {revision} of {service_id} {record.said()}"
    if not force:
        raise CandidateRefused(
            f"{said}, and it is this run's candidate (the same weights, image and profile). Promote another revision, "
            "image or profile, or set force=true to deploy and verify it again"
        )
    return f"force: {said}; deployed and verified again"
