"""doctor's schedules rows: one per model file, read from the Prefect API (read only): each schedule of its
scale-service deployment (`NAME-hours`), active or paused, and when it runs next; a warning when a warm-up is active
while a scale-down is paused, the combination that keeps a GPU warm all night.

Who pauses what is the operator's call (flows/schedule_control.py); doctor only shows the result, including what an
older prefect file's `prefect deploy --all` left (it wrote every schedule paused, the scale-down after a warm-up
that had already run among them)."""

from __future__ import annotations

from datetime import UTC, datetime

from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import DeploymentSchedule
from prefect.client.schemas.responses import DeploymentResponse
from prefect.exceptions import ObjectNotFound
from prefect.server.schemas import schedules as server_schedules
from prefect.utilities.asyncutils import run_coro_as_sync
from pydantic import BaseModel, Field

from tasks.checks.doctor.rows import Check


class ModelHours(BaseModel):
    """What doctor knows of one model file before reading the API."""

    name: str = Field(description="The model file's name without .yaml (deployments/NAME.yaml).")
    deployment: str = Field(description="Its scale-service deployment: scale-service/NAME-hours.")
    profile: str = Field("", description="Its profile, for the cost line.")
    hourly_usd: float | None = Field(None, description="One warm instance's price per hour; None when unknown.")


def next_run(schedule: DeploymentSchedule, now: datetime) -> datetime | None:
    """When the schedule fires next after ``now``, in its own time zone, as Prefect's scheduler computes it: the
    server's schedule classes (models/deployments.py ``_generate_scheduled_flow_runs`` calls the same generator)."""
    kind = getattr(server_schedules, type(schedule.schedule).__name__, None)
    if kind is None:  # a schedule type this Prefect has no server class for: no time rather than a wrong one
        return None
    dates = run_coro_as_sync(kind.model_validate(schedule.schedule.model_dump()).get_dates(n=1, start=now))
    return dates[0] if dates else None


def _label(schedule: DeploymentSchedule, model: ModelHours) -> str:
    """The schedule's slug without the model's name (scale-up, scale-down-evening), else its cron or type."""
    if schedule.slug:
        return schedule.slug.removeprefix(f"{model.name}-")
    return getattr(schedule.schedule, "cron", None) or type(schedule.schedule).__name__


def _min_instances(schedule: DeploymentSchedule, deployment: DeploymentResponse) -> int:
    value = schedule.parameters.get("min_instances", (deployment.parameters or {}).get("min_instances", 0))
    return int(value or 0)


def schedule_row(model: ModelHours, deployment: DeploymentResponse | None, now: datetime) -> Check:
    """One model file's row: each schedule's state and next run; warn when a warm-up runs with a scale-down paused."""
    name = f"schedules {model.name}"
    if deployment is None:
        return Check(name=name, status="warn",
                     detail=f"{model.deployment} is not deployed on this Prefect API: nothing keeps its hours.",
                     fix="python -m flows.bootstrap deploy")  # fmt: skip
    if not deployment.schedules:
        return Check(name=name, status="warn", detail=f"{model.deployment} has no schedules.",
                     fix="python -m flows.sync_deployments && python -m flows.bootstrap deploy")  # fmt: skip
    # Warm-ups first, then by name: the API returns a deployment's schedules latest-updated first.
    ordered = sorted(deployment.schedules, key=lambda s: (-_min_instances(s, deployment), _label(s, model)))
    nexts = {s.id: next_run(s, now) if s.active and not deployment.paused else None for s in deployment.schedules}
    zones = {getattr(s.schedule, "timezone", None) or "UTC" for s in deployment.schedules}
    zone = zones.pop() if len(zones) == 1 else None

    def state(schedule: DeploymentSchedule, short: bool) -> str:
        label = _label(schedule, model)
        when = nexts[schedule.id]
        if short:  # the terminal's line: "up active next Mon 08:00 | down-evening PAUSED"
            label = label.removeprefix("scale-")
            if not schedule.active:
                return f"{label} PAUSED"
            return f"{label} active" + (f" next {when:%a %H:%M}" if when else "")
        if not schedule.active:
            return f"{label} paused"
        zone_name = "" if zone else f" {getattr(schedule.schedule, 'timezone', '')}"
        return f"{label} active" + (f", next {when:%a %Y-%m-%d %H:%M}{zone_name}" if when else "")

    where = f" ({zone})" if zone else ""
    detail = f"{model.deployment}{where}: " + "; ".join(state(s, False) for s in ordered)
    summary = " | ".join(state(s, True) for s in ordered)
    if deployment.paused:
        detail = f"{model.deployment} is paused (the whole deployment): none of its schedules runs. " + detail
        return Check(name=name, status="ok", detail=detail, summary=f"deployment PAUSED: {summary}")
    ups = [s for s in ordered if _min_instances(s, deployment) > 0 and s.active]
    downs = [s for s in ordered if _min_instances(s, deployment) == 0]
    stopped = [s for s in downs if not s.active]
    if not ups or not stopped:
        return Check(name=name, status="ok", detail=detail, summary=summary)
    running = sorted(when for s in downs if s.active and (when := nexts[s.id]) is not None)
    until = f"the next active scale-down ({running[0]:%a %Y-%m-%d %H:%M})" if running else "someone scales it down"
    per_hour = f" ${model.hourly_usd:.2f}/h" if model.hourly_usd else ""
    cost = f",{per_hour} ({model.profile})" if per_hour else ""
    paused = ", ".join(_label(s, model) for s in stopped)
    warning = (
        f"{', '.join(_label(s, model) for s in ups)} is active while {paused} is paused: after a warm-up the GPU "
        f"stays warm until {until}{cost}"
    )
    fix = " && ".join(f"prefect deployment schedule resume {model.deployment} {s.id}" for s in stopped)
    return Check(name=name, status="warn", detail=f"{detail}. {warning}", fix=fix,
                 summary=f"{summary}: WARM AFTER HOURS{per_hour}")  # fmt: skip


def check_schedules(models: list[ModelHours], folder: str, target: str, now: datetime | None = None) -> list[Check]:
    """One row per model file of ``folder`` whose target is ``target``, read from the Prefect API the process is
    configured for (PREFECT_API_URL); reads only."""
    if not models:
        detail = f"no model file in {folder}/ names target '{target}': no business hours to check."
        return [Check(name="schedules", status="ok", detail=detail)]
    moment = now or datetime.now(UTC)
    rows = []
    with get_client(sync_client=True) as client:
        for model in models:
            try:
                deployment = client.read_deployment_by_name(model.deployment)
            except ObjectNotFound:
                deployment = None
            rows.append(schedule_row(model, deployment, moment))
    return rows
