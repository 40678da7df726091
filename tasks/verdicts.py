"""What the pipeline found of each revision it deployed, kept on the service, so that a rollback never lands on one
that failed.

A candidate that failed verification, or breached the SLO and was rolled back, stays Ready in Cloud Run: it is a
revision that started. Only the pipeline knows it is bad. A revision's own labels and annotations cannot change after
it is created (they come from the template), so the verdicts live on the service, in one annotation: a JSON object
``{revision: verdict}``. Updating service annotations alone makes no new revision (run.v2: only template changes
do). The newest ``MAX_VERDICTS`` are kept: annotation values are limited in size, and rollbacks look back a few
revisions, not hundreds.
"""

from __future__ import annotations

import json
from typing import Literal

from google.cloud import run_v2
from google.protobuf import field_mask_pb2

from blocks.target import GcpTarget
from tasks import clients
from tasks.gcp import GCP_RETRY, wait_for

ANNOTATION = "hf-cloudrun-pipeline.dev/revision-verdicts"
MAX_VERDICTS = 50
Verdict = Literal["verified", "failed-verification", "rolled-back"]
BAD: frozenset[str] = frozenset({"failed-verification", "rolled-back"})


def read(service: run_v2.Service) -> dict[str, str]:
    """The verdicts recorded on ``service`` (an unreadable annotation, edited by hand say, records none)."""
    try:
        found = json.loads(service.annotations.get(ANNOTATION, "{}"))
    except ValueError:
        return {}
    return {str(k): str(v) for k, v in found.items()} if isinstance(found, dict) else {}


def record(target: GcpTarget, service_name: str, revision: str, verdict: Verdict) -> None:
    """Record ``verdict`` for ``revision`` on the service (its other annotations kept). Called under the service
    lock, like every other change the pipeline makes to the service."""
    services = clients.run_services(target)
    current = services.get_service(name=service_name, retry=GCP_RETRY)
    verdicts = read(current)
    if verdicts.get(revision) == verdict:
        return
    verdicts.pop(revision, None)
    verdicts[revision] = verdict
    kept = dict(list(verdicts.items())[-MAX_VERDICTS:])
    annotations = {**dict(current.annotations), ANNOTATION: json.dumps(kept, separators=(",", ":"))}
    operation = services.update_service(
        service=run_v2.Service(name=service_name, annotations=annotations),
        update_mask=field_mask_pb2.FieldMask(paths=["annotations"]),
        retry=GCP_RETRY,
    )
    wait_for(operation, clients.operation_polling(target))
