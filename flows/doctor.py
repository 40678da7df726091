"""doctor: check a project before anything is spent. Read-only: it creates, changes and deletes nothing.

    python -m flows.doctor --target production [--profile l4] [--service NAME] [--models deployments]

Each check is its own Prefect task (the run graph shows them side by side); the results are printed one line per check
(and one per model file of the target: its schedules as the Prefect API has them), then the fixes, each once, ending
with one copyable block of ``gcloud projects add-iam-policy-binding`` commands for every role the caller lacks; the rows
are also published as a table artifact. A run with a failed check ends Failed with a one-line message (a returned Failed
state: Prefect logs no traceback for findings). Exit code 0 when nothing failed (warnings allowed), 1 otherwise.
promote-model runs the same checks first when the target sets ``doctor_before_promote``.
"""

from __future__ import annotations

import argparse
import sys

from prefect import State, flow, task
from prefect.artifacts import create_table_artifact
from prefect.states import Failed

from blocks.profile import ServingProfile
from blocks.target import GcpTarget
from flows.common import DEFAULT_TARGET, load_profile, load_target, read_spec
from flows.project import PROJECT_DIR, pipeline_pool
from tasks.checks import doctor as checks
from tasks.checks.doctor import Check, DoctorFailed
from tasks.checks.doctor.schedules import ModelHours, check_schedules
from tasks.common import clients
from tasks.common.progress import artifact_key
from tasks.image.worker_image import rebuild_command
from tasks.report.cost import instance_hour
from tasks.report.pool_image import read_pool
from tasks.report.schedules import hours_deployment


@task(name="doctor_check_project_access")
def doctor_check_project_access(target: GcpTarget, profile: ServingProfile) -> list[Check]:
    """The project exists and the caller may see it (roles/browser on a bare project)."""
    return [checks.check_project_access(target)]


@task(name="doctor_check_apis")
def doctor_check_apis(target: GcpTarget, profile: ServingProfile) -> list[Check]:
    """The APIs the pipeline calls are enabled."""
    return [checks.check_apis(target, profile)]


@task(name="doctor_check_permissions")
def doctor_check_permissions(target: GcpTarget, profile: ServingProfile) -> list[Check]:
    """The caller holds every permission of the deployer role table."""
    return [checks.check_permissions(target, profile)]


@task(name="doctor_check_doctor_permissions")
def doctor_check_doctor_permissions(target: GcpTarget, profile: ServingProfile) -> list[Check]:
    """The caller holds what doctor's own read-only checks call (Service Usage and Org Policy viewers)."""
    return [checks.check_doctor_permissions(target)]


@task(name="doctor_check_act_as")
def doctor_check_act_as(target: GcpTarget, profile: ServingProfile) -> list[Check]:
    """The caller may act as the runtime service account."""
    return [checks.check_act_as(target)]


@task(name="doctor_check_metric_writer")
def doctor_check_metric_writer(target: GcpTarget, profile: ServingProfile) -> list[Check]:
    """With metrics: vllm, the serving account may write vLLM's metrics, or promote may grant it."""
    return [checks.check_metric_writer(target, profile)]


@task(name="doctor_check_gpu_region")
def doctor_check_gpu_region(target: GcpTarget, profile: ServingProfile) -> list[Check]:
    """The region offers the profile's GPU."""
    return [checks.check_gpu_region(target, profile)]


@task(name="doctor_check_subnet")
def doctor_check_subnet(target: GcpTarget, profile: ServingProfile) -> list[Check]:
    """The subnet's Private Google Access (Cloud Storage through an all-traffic VPC)."""
    return [checks.check_subnet(target)]


@task(name="doctor_check_quotas")
def doctor_check_quotas(target: GcpTarget, profile: ServingProfile) -> list[Check]:
    """The region's Cloud Run quotas (vCPU, memory, the GPU type's) cover max_instances instances."""
    return checks.check_quotas(target, profile)


@task(name="doctor_check_build_region")
def doctor_check_build_region(target: GcpTarget, profile: ServingProfile) -> list[Check]:
    """Cloud Build may build in the target's build_region (a new project's restriction to a few regions)."""
    return [checks.check_build_region(target, profile)]


@task(name="doctor_check_org_policies")
def doctor_check_org_policies(target: GcpTarget, profile: ServingProfile) -> list[Check]:
    """Organisation policies that would refuse the bucket, service, ingress, egress or invokers."""
    return checks.check_org_policies(target)


@task(name="doctor_check_build_identity")
def doctor_check_build_identity(target: GcpTarget, profile: ServingProfile) -> list[Check]:
    """The build identity holds what the build needs."""
    return [checks.check_build_identity(target, profile)]


@task(name="doctor_check_bucket")
def doctor_check_bucket(target: GcpTarget, profile: ServingProfile) -> list[Check]:
    """An existing model bucket is in the target's region."""
    return [checks.check_bucket(target)]


@task(name="doctor_check_prefect_api")
def doctor_check_prefect_api(target: GcpTarget, profile: ServingProfile) -> list[Check]:
    """The deployments' work pool can run flow runs that reach the Prefect API (a cloud-run-v2 pool's jobs cannot
    reach a loopback PREFECT_API_URL) without a Prefect credential in plain text."""
    return [checks.check_prefect_api(pipeline_pool(PROJECT_DIR / "prefect.yaml"), target)]


@task(name="doctor_check_worker_image")
def doctor_check_worker_image(target: GcpTarget, profile: ServingProfile) -> list[Check]:
    """A cloud-run-v2 work pool's image holds this project's tree (its runs read deployments/ and the flows there)."""
    pool = pipeline_pool(PROJECT_DIR / "prefect.yaml")
    found = read_pool(pool)
    name = getattr(target, "_block_document_name", None) or "TARGET"  # the block's name, for the fix command
    pool_type, image = (found.type, found.image) if found else (None, None)
    return [checks.check_worker_image(target, pool, pool_type, image, PROJECT_DIR, rebuild_command(name))]


# Each task takes (target, profile) and returns its rows; the table keeps this order.
CHECK_TASKS = [
    doctor_check_project_access,
    doctor_check_apis,
    doctor_check_permissions,
    doctor_check_doctor_permissions,
    doctor_check_act_as,
    doctor_check_metric_writer,
    doctor_check_gpu_region,
    doctor_check_quotas,
    doctor_check_build_region,
    doctor_check_subnet,
    doctor_check_org_policies,
    doctor_check_build_identity,
    doctor_check_bucket,
    doctor_check_prefect_api,
    doctor_check_worker_image,
]


def _hourly(profile: str) -> float | None:
    try:
        return round(sum(usd for _, usd in instance_hour(load_profile(profile))), 2)
    except ValueError:  # a profile block that cannot be loaded: the row says no price rather than fail
        return None


def model_hours(folder: str, target: str) -> tuple[list[ModelHours], list[Check]]:
    """The model files in ``folder`` (relative to the project) whose target is ``target``, and a row for each file
    that cannot be read (the error names the field and the fix)."""
    models, unreadable = [], []
    for path in sorted((PROJECT_DIR / folder).glob("*.yaml")):
        try:
            spec = read_spec(str(path), within=PROJECT_DIR / folder)
        except ValueError as exc:
            unreadable.append(Check(name=f"schedules {path.stem}", status="warn", detail=str(exc).splitlines()[0]))
            continue
        if spec.get("target", DEFAULT_TARGET) != target:
            continue  # that target's doctor shows it
        profile = spec.get("profile", "l4")  # promote-model's default (flows/promote.py)
        models.append(ModelHours(name=path.stem, deployment=f"scale-service/{hours_deployment(path.stem)}",
                                 profile=profile, hourly_usd=_hourly(profile)))  # fmt: skip
    return models, unreadable


@task(name="doctor_check_schedules")
def doctor_check_schedules(target: str, models: str) -> list[Check]:
    """Each model file's business hours as the Prefect API has them: every schedule active or paused, its next run,
    and a warning when a warm-up runs while a scale-down is paused (read only)."""
    found, unreadable = model_hours(models, target)
    return unreadable + check_schedules(found, models, target)


def run_checks(target: GcpTarget, profile: ServingProfile) -> list[Check]:
    """Every check as a task of the current flow run, in a stable order; a check that crashes is a failed row."""
    futures = [check.submit(target, profile) for check in CHECK_TASKS]
    rows: list[Check] = []
    for check, future in zip(CHECK_TASKS, futures, strict=True):
        try:
            rows += future.result()
        except Exception as exc:  # a bug or an outage in one check must not hide the others
            detail = f"crashed: {checks.google_text(exc)}"
            rows.append(Check(name=check.name.removeprefix("doctor_check_"), status="fail", detail=detail))
    return rows


# A wide terminal's line: a row longer than this (a long Google text after a long check name) is cut; the artifact and
# DoctorFailed keep every row whole.
MAX_ROW = 160


def table(rows: list[Check]) -> list[str]:
    """One line per check: status, name, and the row's short text (its fix is printed once, below the table)."""
    width = max(len(r.name) for r in rows)
    lines = [f"{r.status.upper():<4}  {r.name:<{width}}  {r.line}" for r in rows]
    return [line if len(line) <= MAX_ROW else line[: MAX_ROW - 1] + "…" for line in lines]


def fix_lines(rows: list[Check], target: GcpTarget) -> list[str]:
    """Every fix once: the failed and warned rows' own fixes, then one block granting every role the failed rows
    ask for (the member the target's credentials name, else the gcloud account), so the report ends with it."""
    failed = sum(r.status == "fail" for r in rows)
    warned = sum(r.status == "warn" for r in rows)
    lines = [f"{failed} of {len(rows)} checks failed" + (f", {warned} warned." if warned else ".")]
    others = checks.other_fixes(rows)
    if others:  # prose fixes as shell comments, so the whole section pastes into a shell
        lines += ["", "Fixes:", *(f if f.startswith("gcloud ") else f"# {f}" for f in others)]
    roles = checks.roles_to_grant(rows)
    if roles:
        lines += ["", f"Roles to grant on {target.project} to the identity that runs doctor and the flows, then run "
                  "doctor again:", *checks.grant_block(target.project, roles, clients.principal(target))]  # fmt: skip
    return lines


def report(rows: list[Check], target: GcpTarget, profile: str | None = None) -> str:
    """What the terminal shows: a heading, the table, and (when anything is to fix) the fixes, grants last."""
    heading = f"doctor: project {target.project}, region {target.region}" + (f", profile {profile}" if profile else "")
    fixes = fix_lines(rows, target) if any(r.status != "ok" for r in rows) else []
    return "\n".join([heading, *table(rows), *(["", *fixes] if fixes else [])])


def publish(rows: list[Check], target: GcpTarget, service: str | None) -> None:
    """The table artifact the UI shows on the run (name, status, detail, fix: the whole detail, not the line)."""
    create_table_artifact(
        [r.model_dump(include={"name", "status", "detail", "fix"}) for r in rows],
        key=artifact_key(f"doctor-{target.project}-{target.region}"),
        description=f"doctor: {target.project} / {target.region}" + (f" / {service}" if service else ""),
    )


def examine(
    target: GcpTarget, profile: ServingProfile, service: str | None, profile_name: str | None,
    hours: tuple[str, str] | None = None,
) -> list[Check]:  # fmt: skip
    """Run every check, print the report (one print: a single log record, so the block below its first line has
    no log prefix and copies as it is) and publish the artifact. ``hours``: (target name, model folder) to add the
    schedules rows (the doctor flow; promote-model's first step checks the project only)."""
    rows = run_checks(target, profile)
    if hours is not None:
        try:
            rows += doctor_check_schedules(*hours)
        except Exception as exc:  # like any check: a crash is a row, the other rows still print
            rows.append(Check(name="schedules", status="fail", detail=f"crashed: {checks.google_text(exc)}"))
    print(report(rows, target, profile_name))
    publish(rows, target, service)
    return rows


def failure(rows: list[Check], target: GcpTarget) -> DoctorFailed:
    """The error for failed rows, carrying the same fixes the report printed (grants as one block, last)."""
    roles = checks.roles_to_grant(rows)
    grants = checks.grant_block(target.project, roles, clients.principal(target)) if roles else []
    return DoctorFailed(rows, checks.other_fixes(rows) + grants)


def check_project(target: GcpTarget, profile: ServingProfile, service: str | None = None) -> list[Check]:
    """Run, print and publish every check; raise DoctorFailed when any failed (promote-model's first step)."""
    rows = examine(target, profile, service, None)
    if any(r.status == "fail" for r in rows):
        raise failure(rows, target)
    return rows


def final_message(rows: list[Check]) -> str:
    """The run's one-line final state: the report above says the rest."""
    failed = sum(r.status == "fail" for r in rows)
    roles = len(checks.roles_to_grant(rows))
    to_do = f"{roles} role{'s' if roles > 1 else ''} to grant above" if roles else "fixes above"
    return f"{failed} check{'s' if failed > 1 else ''} failed; {to_do}"


@flow(name="doctor", log_prints=True)
def doctor(
    target: str, profile: str = "l4", service: str | None = None, models: str = "deployments"
) -> list[Check] | State:
    """Check a GCP project read-only before a promotion spends anything.

    Project access, APIs enabled, the deployer's permissions and actAs on the runtime service account, the GPU offered
    in the region and its quota against max_instances, organisation policies (resource locations, Cloud Run ingress and
    VPC egress, domain-restricted sharing), the build identity, an existing bucket's location, whether a
    cloud-run-v2 work pool's image holds this tree, and the schedules of each model file in ``models`` that names
    ``target`` (active or paused, next run). Prints one line per check, then each fix once and the roles to grant as
    one block. Returns the rows; when a check failed, a Failed state whose message is one line (calling the flow
    raises DoctorFailed, with the rows, from it).
    """
    gcp = load_target(target)
    rows = examine(gcp, load_profile(profile), service, profile, hours=(target, models))
    if any(r.status == "fail" for r in rows):
        # Returned, not raised: a raised exception is logged at ERROR with its traceback and again in the final state,
        # which for findings only repeats the report above.
        return Failed(message=final_message(rows), data=failure(rows, gcp))
    return rows


def main(argv: list[str] | None = None) -> int:
    """``python -m flows.doctor``: 0 when no check failed, 1 when one did (the report above says what to do)."""
    parser = argparse.ArgumentParser(prog="python -m flows.doctor", description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True, help="GcpTarget block name")
    parser.add_argument("--profile", default="l4", help="preset (l4, rtx-pro-6000, cpu) or ServingProfile block")
    parser.add_argument("--service", default=None, help="Cloud Run service name (shown in the report)")
    parser.add_argument("--models", default="deployments", help="folder of model files whose schedules to show")
    args = parser.parse_args(argv)
    try:
        doctor(target=args.target, profile=args.profile, service=args.service, models=args.models)
    except DoctorFailed:
        return 1  # the table above says what and how to fix
    except ValueError as exc:
        print(f"doctor: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
