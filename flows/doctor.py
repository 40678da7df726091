"""doctor: check a project before anything is spent. Read-only: it creates, changes and deletes nothing.

    python -m flows.doctor --target production [--profile l4] [--service NAME]

Each check is its own Prefect task (the run graph shows them side by side); the results are printed as a table
and published as a table artifact, every row with the command that fixes it. Exit code 0 when nothing failed
(warnings allowed), 1 otherwise. promote-model runs the same checks first when the target sets
``doctor_before_promote``.
"""

from __future__ import annotations

import argparse
import sys

from prefect import flow, task
from prefect.artifacts import create_table_artifact

from blocks.profile import ServingProfile
from blocks.target import GcpTarget
from flows.common import load_profile, load_target
from tasks import doctor as checks
from tasks.doctor import Check, DoctorFailed
from tasks.progress import artifact_key


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


# Each task takes (target, profile) and returns its rows; the table keeps this order.
CHECK_TASKS = [
    doctor_check_apis,
    doctor_check_permissions,
    doctor_check_doctor_permissions,
    doctor_check_act_as,
    doctor_check_metric_writer,
    doctor_check_gpu_region,
    doctor_check_quotas,
    doctor_check_subnet,
    doctor_check_org_policies,
    doctor_check_build_identity,
    doctor_check_bucket,
]


def run_checks(target: GcpTarget, profile: ServingProfile) -> list[Check]:
    """Every check as a task of the current flow run, in a stable order; a check that crashes is a failed row."""
    futures = [check.submit(target, profile) for check in CHECK_TASKS]
    rows: list[Check] = []
    for check, future in zip(CHECK_TASKS, futures, strict=True):
        try:
            rows += future.result()
        except Exception as exc:  # a bug or an outage in one check must not hide the others
            rows.append(Check(name=check.name.removeprefix("doctor_check_"), status="fail", detail=f"crashed: {exc}"))
    return rows


def table(rows: list[Check]) -> str:
    """The rows as a fixed-width text table for the terminal."""
    header = ("check", "status", "detail", "fix")
    lines = [(r.name, r.status.upper(), r.detail, r.fix) for r in rows]
    widths = [max(len(header[i]), *(len(line[i]) for line in lines)) if i < 2 else 0 for i in range(4)]
    out = [f"{header[0]:<{widths[0]}}  {header[1]:<{widths[1]}}  {header[2]}"]
    for name, status, detail, fix in lines:
        out.append(f"{name:<{widths[0]}}  {status:<{widths[1]}}  {detail}")
        if fix:
            out.append(f"{'':<{widths[0]}}  {'':<{widths[1]}}  fix: {fix}")
    return "\n".join(out)


def publish(rows: list[Check], target: GcpTarget, service: str | None) -> None:
    """The table artifact the UI shows on the run."""
    create_table_artifact(
        [r.model_dump() for r in rows],
        key=artifact_key(f"doctor-{target.project}-{target.region}"),
        description=f"doctor: {target.project} / {target.region}" + (f" / {service}" if service else ""),
    )


def check_project(target: GcpTarget, profile: ServingProfile, service: str | None = None) -> list[Check]:
    """Run, print and publish every check; raise DoctorFailed when any failed (promote-model's first step)."""
    rows = run_checks(target, profile)
    print(table(rows))
    publish(rows, target, service)
    if any(r.status == "fail" for r in rows):
        raise DoctorFailed(rows)
    return rows


@flow(name="doctor", log_prints=True)
def doctor(target: str, profile: str = "l4", service: str | None = None) -> list[Check]:
    """Check a GCP project read-only before a promotion spends anything.

    APIs enabled, the deployer's permissions and actAs on the runtime service account, the GPU offered in the region
    and its quota against max_instances, organisation policies (resource locations, Cloud Run ingress and VPC
    egress, domain-restricted sharing), the build identity, and an existing bucket's location. Every row carries
    the command that fixes it. Returns the rows; the run fails when any check failed.
    """
    gcp = load_target(target)
    serving = load_profile(profile)
    return check_project(gcp, serving, service)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.doctor", description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True, help="GcpTarget block name")
    parser.add_argument("--profile", default="l4", help="preset (l4, rtx-pro-6000, cpu) or ServingProfile block")
    parser.add_argument("--service", default=None, help="Cloud Run service name (shown in the report)")
    args = parser.parse_args(argv)
    try:
        doctor(target=args.target, profile=args.profile, service=args.service)
    except DoctorFailed:
        return 1  # the table above says what and how to fix
    except ValueError as exc:
        print(f"doctor: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
