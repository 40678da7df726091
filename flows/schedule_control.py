"""Who decides whether a model schedule runs: its operator. bootstrap only holds back what cannot run yet.

The prefect files' schedules carry a slug and no `active:` (flows/sync_deployments.py). Prefect 3.9.1's `prefect
deploy` updates a deployment's schedules by slug when every schedule has one, writing only the fields it was given
(server/api/deployments.py ``update_deployment``, models/deployments.py ``update_deployment_schedule``), so a
redeploy keeps each schedule's state: the operator's pause survives, an active scale-down stays active. A schedule
the deploy creates is active (``DeploymentScheduleCreate.active`` defaults to true).

After the deploy, bootstrap pauses the schedules whose GcpTarget block is missing (their runs could only fail) and
records them in a Prefect Variable, ``HELD_VARIABLE``; a later bootstrap resumes those, and only those, once the
block exists. A paused schedule it did not record is the operator's and is left alone: a pause carries no author in
Prefect's API (a DeploymentSchedule is its schedule, slug, parameters, active flag and timestamps), so the record is
how bootstrap tells its own pauses apart. The same class of problem upstream: PrefectHQ/prefect#14973 (a redeploy
re-activated schedules turned off in the UI) and #18822 (a redeploy should leave a schedule it does not change).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import yaml
from prefect.client.orchestration import SyncPrefectClient
from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterName
from prefect.client.schemas.responses import DeploymentResponse
from prefect.exceptions import ObjectNotFound
from prefect.variables import Variable

from blocks import GcpTarget
from flows.common import DEFAULT_TARGET

# A Prefect Variable (names: letters, digits, dashes, underscores): {deployment name: [slugs bootstrap paused]}.
HELD_VARIABLE = "hf_pipeline_schedules_held"


class Decision(NamedTuple):
    active: bool
    held: bool  # paused by bootstrap for a missing target: resumed by a later bootstrap once the target exists
    why: str


def decide(active: bool, new: bool, held: bool, target_exists: bool) -> Decision:
    """The state bootstrap leaves one schedule in. ``active``: its state after `prefect deploy`; ``new``: the deploy
    created it; ``held``: an earlier bootstrap paused it for a missing target."""
    if not target_exists:
        if active or new or held:
            return Decision(False, True, "paused until its target exists")
        return Decision(False, False, "paused by the operator, kept")
    if held or new:
        return Decision(True, False, "active" if active else "resumed: its target exists")
    return Decision(active, False, "active" if active else "paused by the operator, kept")


def scheduled_deployments(prefect_file: Path) -> dict[str, str]:
    """The prefect file's deployments that have schedules: name -> entrypoint."""
    entries = yaml.safe_load(prefect_file.read_text()).get("deployments") or []
    return {d["name"]: d["entrypoint"] for d in entries if d.get("schedules")}


def read_scheduled(client: SyncPrefectClient, prefect_file: Path) -> list[DeploymentResponse]:
    """The prefect file's scheduled deployments as the API has them (another project's of the same name left out)."""
    scheduled = scheduled_deployments(prefect_file)
    if not scheduled:
        return []
    found = client.read_deployments(deployment_filter=DeploymentFilter(name=DeploymentFilterName(any_=list(scheduled))))
    return [d for d in found if scheduled.get(d.name) == d.entrypoint]


def schedule_slugs(client: SyncPrefectClient, prefect_file: Path) -> dict[str, set[str]]:
    """The slugs each scheduled deployment has now (read before `prefect deploy`, to tell its new schedules)."""
    return {d.name: {s.slug for s in d.schedules if s.slug} for d in read_scheduled(client, prefect_file)}


def _target_exists(client: SyncPrefectClient, name: str) -> bool:
    try:
        client.read_block_document_by_name(name, block_type_slug=GcpTarget.get_block_type_slug())
    except ObjectNotFound:
        return False
    return True


def _held() -> dict[str, list[str]] | None:
    """The record, or None before any bootstrap wrote one."""
    value: Any = Variable.get(HELD_VARIABLE, default=None)
    return value if isinstance(value, dict) else None


def settle(client: SyncPrefectClient, prefect_file: Path, before: dict[str, set[str]]) -> list[str]:
    """After `prefect deploy`: pause the schedules whose target is missing, resume those an earlier bootstrap paused
    once their target exists, leave every other state as its operator set it. One line per deployment."""
    record = _held()
    held_after: dict[str, list[str]] = {}
    lines = []
    for deployment in read_scheduled(client, prefect_file):
        target = (deployment.parameters or {}).get("target", DEFAULT_TARGET)
        exists = _target_exists(client, target)
        known = before.get(deployment.name, set())
        held = set((record or {}).get(deployment.name, []))
        decisions: dict[str, list[str]] = {}
        for schedule in deployment.schedules:
            # No record: the server was kept by a bootstrap from before it, which resumed every paused schedule whose
            # target existed, on every deploy. This once more, then the record decides: a paused schedule then is the
            # one its prefect file paused (`active: false`, as those files said) or a target still missing.
            was_held = schedule.slug in held or (record is None and not schedule.active)
            decision = decide(schedule.active, schedule.slug not in known, was_held, exists)
            if decision.active != schedule.active:
                # The parameters go along: on Prefect 3.9.1 a PATCH with only `active` stores the schedule's
                # parameters as {} (seen in tests/e2e/test_deployments.py), and min_instances would be lost.
                client.update_deployment_schedule(
                    deployment.id, schedule.id, active=decision.active, parameters=schedule.parameters
                )
            if decision.held and schedule.slug:
                held_after.setdefault(deployment.name, []).append(schedule.slug)
            decisions.setdefault(decision.why, []).append(schedule.slug or str(schedule.id))
        full_name = f"{client.read_flow(deployment.flow_id).name}/{deployment.name}"
        lines.append(describe(full_name, len(deployment.schedules), decisions, target))
    if record is None or held_after != record:  # written the first time even empty: from then on it decides
        Variable.set(HELD_VARIABLE, {name: sorted(slugs) for name, slugs in held_after.items()}, overwrite=True)
    return sorted(lines)


def describe(full_name: str, total: int, decisions: dict[str, list[str]], target: str) -> str:
    """One deployment's line: "NAME: 3 schedules active", or each group of schedules with its state and why."""
    name = full_name.split("/", 1)[1]
    resumed = decisions.get("resumed: its target exists", [])
    if set(decisions) <= {"active", "resumed: its target exists"}:
        return f"{name}: {total} schedules active" + (f" ({len(resumed)} resumed: {target} exists)" if resumed else "")
    parts = []
    for why, slugs in sorted(decisions.items()):
        if why.startswith("paused until"):
            why = f"paused: no GcpTarget block '{target}' (create it with bootstrap gcp, which resumes them)"
        elif why.startswith("paused by the operator"):
            why += f" (`prefect deployment schedule resume {full_name} ID` resumes one)"
        parts.append(f"{', '.join(sorted(slugs))} {why}")
    return f"{name}: " + "; ".join(parts)
