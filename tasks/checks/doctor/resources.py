"""doctor's checks of what promote-model creates or changes: the subnet's Private Google Access, the model bucket's
region, and the build identity's grants."""

from __future__ import annotations

from google.api_core import exceptions as gexc

from blocks.profile import ServingProfile
from blocks.target import GcpTarget
from tasks.checks.doctor.access import act_as
from tasks.checks.doctor.rows import Check, disabled_service, enable_command, holds, read_denied, unreadable
from tasks.common import clients
from tasks.infra.build_identity import BUILD_BUCKET_ROLE, REPOSITORY_ROLE
from tasks.infra.ensure import repository_path

BUCKET_GET = "storage.buckets.get"


def check_subnet(target: GcpTarget) -> Check:
    """The subnet's Private Google Access: with the all-traffic egress promote-model renders, Cloud Storage (the
    weights volume) is reached through the VPC and needs it (Cloud Run's networking best practices)."""
    name = "subnet"
    try:
        subnet = clients.compute_subnetworks(target).get(
            project=target.project, region=target.region, subnetwork=target.subnet
        )
    except gexc.NotFound:
        return Check(name=name, status="ok", detail=f"{target.subnet} does not exist yet: promote-model creates it "
                     "with Private Google Access on.")  # fmt: skip
    except gexc.GoogleAPICallError as exc:
        return unreadable(name, target, exc, "roles/compute.networkAdmin")
    if subnet.private_ip_google_access:
        return Check(name=name, status="ok", detail=f"{target.subnet} has Private Google Access on.")
    return Check(
        name=name, status="warn",
        detail=f"Private Google Access is off on {target.subnet}: a revision with all-traffic egress cannot reach "
        "Cloud Storage, so its weights volume never loads; promote-model turns it on (ensure infrastructure)",
        fix=f"gcloud compute networks subnets update {target.subnet} --region {target.region} "
        f"--project {target.project} --enable-private-ip-google-access",
    )  # fmt: skip


def check_bucket(target: GcpTarget) -> Check:
    """An existing bucket is in the target's region (lesson 18): a bucket's location cannot change."""
    name = "bucket location"
    bucket_name = target.bucket_name
    try:
        bucket = clients.storage(target).lookup_bucket(bucket_name)
    except gexc.Forbidden as exc:
        service = disabled_service(exc)
        if service:
            return Check(name=name, status="fail", detail=f"{service} is not enabled, so this could not be checked.",
                         fix=enable_command([service], target.project))  # fmt: skip
        if not holds(target, BUCKET_GET):  # refused for want of a role in this project, not a foreign bucket
            return read_denied(name, target, exc.message, "roles/storage.admin")
        return Check(
            name=name, status="fail",
            detail=f"gs://{bucket_name} exists but this identity may not read it (bucket names are global: it may "
            "belong to another project).",
            fix=f"set the target's bucket to a name of your own, e.g. {target.project}-{target.region}-models",
        )  # fmt: skip
    if bucket is None:
        return Check(name=name, status="ok", detail=f"gs://{bucket_name} does not exist yet; promote creates it in "
                     f"{target.region}.")  # fmt: skip
    location = (bucket.location or "").lower()
    if location == target.region and (bucket.location_type or "region") == "region":
        return Check(name=name, status="ok", detail=f"gs://{bucket_name} is in {target.region}.")
    return Check(
        name=name, status="fail",
        detail=f"gs://{bucket_name} is in {bucket.location} ({bucket.location_type}), not {target.region}: weights "
        "would cross regions on every cold start.",
        fix=f"set the target's bucket to a new name (created in {target.region}), e.g. "
        f"{bucket_name[:50]}-{target.region}",
    )  # fmt: skip


def check_build_identity(target: GcpTarget, profile: ServingProfile) -> Check:
    """The dedicated build identity (tasks/infra/build_identity.py) when the profile builds its image: the caller may
    act as it, and it holds Storage Admin on the build bucket, artifactregistry.writer on the repository and nothing on
    the model bucket (promote grants what is missing and removes the rest; this row says what it will change)."""
    name = "build identity"
    if profile.build is None:
        return Check(name=name, status="ok", detail="prebuilt image: no Cloud Build.")
    email = target.build_service_account_email
    acting = act_as(name, target, email)
    if acting.status != "ok" or "will be created" in acting.detail:
        return acting
    member = f"serviceAccount:{email}"
    missing: list[tuple[str, str]] = []  # (resource, role)
    extra: list[tuple[str, str]] = []  # (resource, role): roles on the model bucket, which builds never touch
    try:
        for bucket, wanted in ((target.build_bucket_name, BUILD_BUCKET_ROLE), (target.bucket_name, None)):
            try:
                policy = clients.storage(target).bucket(bucket).get_iam_policy(requested_policy_version=3)
            except gexc.NotFound:
                continue  # no bucket yet: promote creates it (and grants on the build bucket)
            held = {b["role"] for b in policy.bindings if member in b.get("members", ())}
            if wanted is not None and wanted not in held:
                missing.append((f"gs://{bucket}", wanted))
            if wanted is None:
                extra += [(f"gs://{bucket}", role) for role in sorted(held)]
    except gexc.GoogleAPICallError as exc:
        return unreadable(name, target, exc, "roles/storage.admin")
    try:
        policy = clients.artifact_registry(target).get_iam_policy(request={"resource": repository_path(target)})
        if not any(b.role == REPOSITORY_ROLE and member in b.members for b in policy.bindings):
            missing.append((repository_path(target), REPOSITORY_ROLE))
    except gexc.NotFound:
        pass  # no repository yet: promote creates it and grants the role
    except gexc.GoogleAPICallError as exc:
        return unreadable(name, target, exc, "roles/artifactregistry.admin")
    if not missing and not extra:
        return Check(name=name, status="ok", detail=f"{email} exists and holds its roles on the build bucket and "
                     "repository, none on the model bucket.")  # fmt: skip
    fixes = [
        f"gcloud storage buckets add-iam-policy-binding {resource} --member={member} --role={role}"
        if resource.startswith("gs://")
        else f"gcloud artifacts repositories add-iam-policy-binding {target.artifact_repository} "
        f"--location {target.region} --project {target.project} --member={member} --role={role}"
        for resource, role in missing
    ]
    fixes += [
        f"gcloud storage buckets remove-iam-policy-binding {resource} --member={member} --role={role}"
        for resource, role in extra
    ]
    said = [f"lacks {', '.join(f'{role} on {resource}' for resource, role in missing)}"] if missing else []
    said += [f"holds {', '.join(f'{role} on {resource}' for resource, role in extra)}"] if extra else []
    return Check(name=name, status="warn", detail=f"{email} {' and '.join(said)}; promote grants and removes these "
                 "before the build.", fix=" && ".join(fixes))  # fmt: skip
