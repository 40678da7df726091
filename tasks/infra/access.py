"""Least-privilege IAM bindings, each a read-modify-write with the policy's etag, retried when it races.

The serving account gets roles/storage.objectViewer on the model bucket only (seed 004's codelab grants
storage.admin: too much) and roles/secretmanager.secretAccessor on the one secret it reads; the service stays
private and roles/run.invoker goes only to the principals the target lists (lessons 19 and 21).
"""

from __future__ import annotations

from google.api_core import exceptions as gexc
from prefect import task

from blocks.target import GcpTarget
from tasks.common import clients
from tasks.common.gcp import POLICY_CONFLICT_RETRY, EnsureResult, InfraError, gcp_errors
from tasks.common.naming import COMPILE_CACHE_PREFIX
from tasks.common.permissions import METRIC_WRITER_ROLE
from tasks.infra.ensure import PUBLIC_MEMBERS, secret_path
from tasks.infra.propagation import note_grant, when_visible

OBJECT_VIEWER = "roles/storage.objectViewer"
CACHE_WRITER = "roles/storage.objectUser"
SECRET_ACCESSOR = "roles/secretmanager.secretAccessor"
RUN_INVOKER = "roles/run.invoker"


def _member(target: GcpTarget) -> str:
    return f"serviceAccount:{target.service_account_email}"


def grant_bucket_object_viewer(target: GcpTarget, compile_cache: bool = False) -> EnsureResult:
    """objectViewer for the serving account on the model bucket, and no other role of its there; with
    ``compile_cache``, also roles/storage.objectUser on objects under compile-cache/ alone (an IAM condition).

    The conditional grant is never removed here: the account serves every service of the target, and another
    service may keep its compile cache there (tasks/deploy/compile_cache.py)."""
    bucket = clients.storage(target).bucket(target.bucket_name)
    member = _member(target)
    cache_writer = compile_cache_binding(target.bucket_name)

    def ours(binding: dict) -> bool:
        return binding["role"] == cache_writer["role"] and binding.get("condition") == cache_writer["condition"]

    def edit() -> list[str]:
        policy = bucket.get_iam_policy(requested_policy_version=3)
        changes = []
        for binding in policy.bindings:
            viewer = binding["role"] == OBJECT_VIEWER and not binding.get("condition")
            if not viewer and not ours(binding) and member in binding["members"]:
                binding["members"].discard(member)
                changes.append(f"removed {binding['role']}")
        wanted = [({"role": OBJECT_VIEWER}, OBJECT_VIEWER)]
        if compile_cache:
            wanted.append((cache_writer, f"{CACHE_WRITER} on {compile_cache_prefix(target.bucket_name)}"))
        for shape, said in wanted:
            found = next((b for b in policy.bindings if b["role"] == shape["role"]
                          and b.get("condition") == shape.get("condition")), None)  # fmt: skip
            if found is None:
                policy.bindings.append({**shape, "members": {member}})
                changes.append(f"granted {said}")
            elif member not in found["members"]:
                found["members"].add(member)
                changes.append(f"granted {said}")
        if changes:
            policy.bindings = [b for b in policy.bindings if b["members"]]
            if any(b.get("condition") for b in policy.bindings):
                policy.version = 3  # conditional bindings need version 3 (IAM docs, "Policy versions")
            bucket.set_iam_policy(policy)
        return changes

    with gcp_errors("storage", "roles/storage.admin", f"IAM policy of gs://{target.bucket_name}", target):
        # A service account created moments ago is unknown to Cloud Storage until IAM has propagated it.
        changes = when_visible(POLICY_CONFLICT_RETRY(edit), target.service_account_email, "Cloud Storage")
    if changes:
        note_grant(target.service_account_email, target.bucket_name)  # the revision mounting it right after waits
    return _result("iam", f"gs://{target.bucket_name} {OBJECT_VIEWER} {member}", changes)


def compile_cache_prefix(bucket: str) -> str:
    return f"gs://{bucket}/{COMPILE_CACHE_PREFIX}/"


def compile_cache_binding(bucket: str) -> dict:
    """objectUser (create, read, overwrite, delete objects) on the compile caches only: uniform bucket-level access
    (which the model bucket has, tasks/infra/ensure.py) is what allows a condition on a bucket's policy."""
    return {
        "role": CACHE_WRITER,
        "condition": {
            "title": "compile-cache only",
            "description": "vLLM's compile caches (promote-model, compile_cache); the weights stay read-only",
            # Cloud Storage's documented resource-name prefix form (IAM Conditions, "resource.name.startsWith").
            "expression": f'resource.name.startsWith("projects/_/buckets/{bucket}/objects/{COMPILE_CACHE_PREFIX}/")',
        },
    }


def set_role_members(client, resource: str, role: str, wanted: set[str], exact: bool) -> list[str]:
    """Make ``role`` on ``resource`` hold ``wanted`` (exactly, or at least), through ``client``'s resource-level
    ``get_iam_policy``/``set_iam_policy`` (Secret Manager, Artifact Registry, Cloud Run): one read-modify-write
    with the policy's etag, retried when a concurrent change wins. Returns the changes made."""

    def edit() -> list[str]:
        policy = client.get_iam_policy(request={"resource": resource})
        binding = next((b for b in policy.bindings if b.role == role), None)
        current = set(binding.members) if binding is not None else set()
        target_members = wanted if exact else current | wanted
        if current == target_members:
            return []
        changes = [f"granted {role} to {m}" for m in sorted(target_members - current)]
        changes += [f"removed {role} from {m}" for m in sorted(current - target_members)]
        if binding is None:
            binding = policy.bindings.add(role=role)
        del binding.members[:]
        binding.members.extend(sorted(target_members))
        kept = [b for b in policy.bindings if b.members]
        del policy.bindings[:]
        policy.bindings.extend(kept)
        # The policy carries the etag it was read with: a concurrent change makes this fail and retry.
        client.set_iam_policy(request={"resource": resource, "policy": policy})
        return changes

    return POLICY_CONFLICT_RETRY(edit)()


def grant_to_new_account(client, resource: str, role: str, email: str, seen_by: str) -> list[str]:
    """``role`` on ``resource`` for the service account ``email`` (other members kept), retried while IAM has
    not yet propagated a newly created account to ``seen_by`` (the API holding ``resource``)."""
    return when_visible(
        lambda: set_role_members(client, resource, role, {f"serviceAccount:{email}"}, exact=False), email, seen_by
    )


def grant_secret_accessor(target: GcpTarget, secret_id: str | None = None, email: str | None = None) -> EnsureResult:
    """secretAccessor on one secret (not the project) for ``email``, by default the serving account."""
    manager = clients.secret_manager(target)
    name = secret_path(target, secret_id)
    email = email or target.service_account_email
    member = f"serviceAccount:{email}"
    with gcp_errors("secretmanager", "roles/secretmanager.admin", f"IAM policy of {name}", target):
        changes = grant_to_new_account(manager, name, SECRET_ACCESSOR, email, "Secret Manager")
    if changes:
        note_grant(email)  # the deploy right after waits for it to take effect
    return _result("iam", f"{name} {SECRET_ACCESSOR} {member}", changes)


def ensure_service_invokers(target: GcpTarget, service_id: str) -> EnsureResult:
    """roles/run.invoker on the service for exactly the target's invokers; never public."""
    services = clients.run_services(target)
    name = f"{target.location_path}/services/{service_id}"
    wanted = set(target.invokers)
    if wanted & PUBLIC_MEMBERS:
        raise InfraError("invokers: the service stays private; remove allUsers / allAuthenticatedUsers")
    with gcp_errors("run", "roles/run.admin", f"IAM policy of service {service_id}", target):
        try:
            changes = set_role_members(services, name, RUN_INVOKER, wanted, exact=True)
        except gexc.NotFound:
            raise InfraError(f"service {service_id} does not exist yet; deploy it before granting invokers") from None
    return _result("iam", f"{name} {RUN_INVOKER}", changes)


def grant_metric_writer(target: GcpTarget) -> EnsureResult:
    """roles/monitoring.metricWriter for the serving account on the project, for the Prometheus sidecar to write
    vLLM's metrics (profile metrics: vllm). The project is the narrowest place it can be granted: Monitoring has no
    resource-level IAM. Granting it needs resourcemanager.projects.setIamPolicy; a deployer without it (least
    privilege) gets the one command a project IAM admin runs once, and the next run finds the binding."""
    projects = clients.projects(target)
    resource = f"projects/{target.project}"
    member = _member(target)
    with gcp_errors("cloudresourcemanager", "roles/resourcemanager.projectIamAdmin",
                    f"IAM policy of {resource} (the serving account's {METRIC_WRITER_ROLE})", target):  # fmt: skip
        changes = grant_to_new_account(projects, resource, METRIC_WRITER_ROLE, target.service_account_email,
                                       "Resource Manager")  # fmt: skip
    return _result("iam", f"{resource} {METRIC_WRITER_ROLE} {member}", changes)


def _result(kind: str, name: str, changes: list[str]) -> EnsureResult:
    return EnsureResult(kind=kind, name=name, action="updated" if changes else "found", changes=changes)


gcs_grant_object_viewer = task(name="gcs_grant_object_viewer")(grant_bucket_object_viewer)
secretmanager_grant_accessor = task(name="secretmanager_grant_accessor")(grant_secret_accessor)
run_ensure_invokers = task(name="run_ensure_invokers")(ensure_service_invokers)
resourcemanager_grant_metric_writer = task(name="resourcemanager_grant_metric_writer")(grant_metric_writer)
