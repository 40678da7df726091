"""What a scale-service or rollback-model run did, said once: one outcome line for the run log and the same facts
as a markdown artifact on the run (service, the revision serving, traffic, URL, what changed).

The rendering is pure (tests/unit/test_run_outcome_schema.py); ``read_service_state`` is the one Cloud Run read.
"""

from __future__ import annotations

from google.api_core import exceptions as gexc
from prefect import task
from prefect.artifacts import create_markdown_artifact
from pydantic import BaseModel, Field

from blocks.target import GcpTarget
from tasks.common import clients
from tasks.common.gcp import GCP_RETRY, gcp_errors
from tasks.common.progress import artifact_key
from tasks.deploy.cloudrun import service_path


class ServiceState(BaseModel):
    """A Cloud Run service as a run's outcome reports it."""

    service: str = Field(description="The service id (its short name).")
    url: str
    traffic: list[tuple[str, int]] = Field(description="The revisions that take traffic, with their shares.")
    min_instances: int
    max_instances: int | None = Field(description="None: Cloud Run's default (no maximum set on the service).")

    @property
    def serving_revision(self) -> str:
        return max(self.traffic, key=lambda share: share[1])[0] if self.traffic else "-"


def read_service_state(target: GcpTarget, service_id: str) -> ServiceState | None:
    """The service's URL, traffic and scaling; None when there is no such service."""
    with gcp_errors("run", "roles/run.viewer", f"reading service {service_id}", target):
        try:
            found = clients.run_services(target).get_service(name=service_path(target, service_id), retry=GCP_RETRY)
        except gexc.NotFound:
            return None
    traffic = [(share.revision, share.percent) for share in found.traffic_statuses if share.percent]
    return ServiceState(
        service=service_id, url=found.uri, traffic=traffic, min_instances=found.scaling.min_instance_count,
        max_instances=found.scaling.max_instance_count or None,
    )  # fmt: skip


run_read_service = task(name="run_read_service")(read_service_state)


def traffic_text(traffic: list[tuple[str, int]]) -> str:
    return ", ".join(f"{revision} {percent} %" for revision, percent in traffic) or "none (no serving revision)"


def change_text(before: object, after: object) -> str:
    """``a -> b``, or ``a`` when it stayed; ``not set`` for a value left to Cloud Run's default."""
    before, after = ("not set" if value is None else value for value in (before, after))
    return f"{after}" if before == after else f"{before} -> {after}"


class Outcome(BaseModel):
    """One run's outcome: the line the run ends with, and the facts the artifact lists under it."""

    kind: str = Field(description="The flow's verb and artifact prefix: scale, rollback.")
    service: str
    line: str
    facts: list[tuple[str, str]] = Field(default_factory=list)

    @property
    def key(self) -> str:
        return artifact_key(f"{self.kind}-{self.service}")

    def markdown(self) -> str:
        rows = [f"| {name} | {value} |" for name, value in self.facts]
        return "\n".join([f"# {self.kind} {self.service}", "", self.line, "", "| | |", "|---|---|", *rows]) + "\n"


def state_facts(state: ServiceState, target: GcpTarget) -> list[tuple[str, str]]:
    return [
        ("service", f"{state.service} ({target.project}/{target.region})"),
        ("serving revision", state.serving_revision),
        ("traffic", traffic_text(state.traffic)),
        ("URL", state.url),
    ]


def scale_outcome(
    target: GcpTarget, before: ServiceState, min_instances: int, max_instances: int | None, changed: bool
) -> Outcome:
    """What scale-service did to a service that exists: min and max before and after, and what serves where
    (``before``: scaling leaves traffic and URL as they were, so the read before it says what serves after)."""
    new_min = change_text(before.min_instances, min_instances)
    new_max = change_text(before.max_instances, max_instances)
    line = (
        f"scale {before.service}: min {new_min}, max {new_max} ({'changed' if changed else 'no change'}); "
        f"traffic {traffic_text(before.traffic)}, url {before.url}"
    )
    facts = [
        *state_facts(before, target),
        ("min instances", new_min),
        ("max instances", new_max),
        ("changed", "yes" if changed else "no"),
    ]
    return Outcome(kind="scale", service=before.service, line=line, facts=facts)


def skipped_scale(service: str, why: str) -> Outcome:
    """A scale that did nothing on purpose (not promoted yet, a late scale-up): the line says why."""
    return Outcome(kind="scale", service=service, line=f"scale {service}: {why}", facts=[("changed", "no")])


def rollback_outcome(
    target: GcpTarget, service: str, after: ServiceState | None, from_revision: str, to_revision: str
) -> Outcome:
    """Where rollback-model moved traffic, as Cloud Run reports it after the move (``after``: None when the service
    could no longer be read)."""
    if after is not None and after.traffic != [(to_revision, 100)]:
        moved = f"traffic now {traffic_text(after.traffic)}"  # what Cloud Run says, not what was asked for
    else:
        moved = f"traffic 100 % -> {to_revision}"
    was = "already serving" if from_revision == to_revision else f"was {from_revision or 'none'}"
    url = after.url if after is not None else "unknown (the service could not be read after the move)"
    line = f"rollback {service}: {moved} ({was}), url {url}"
    facts = state_facts(after, target) if after is not None else [("service", service)]
    if from_revision and from_revision != to_revision:
        facts.append(("rolled back from", f"{from_revision} (recorded as rolled back)"))
    return Outcome(kind="rollback", service=service, line=line, facts=facts)


def publish(outcome: Outcome) -> None:
    """The outcome line in the run log, and the artifact (``scale-<service>``, ``rollback-<service>``) in the UI."""
    print(outcome.line)
    create_markdown_artifact(outcome.markdown(), key=outcome.key, description=outcome.line[:500])
