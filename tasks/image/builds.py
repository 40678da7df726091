"""Build images with Cloud Build: pack the source (keeping .git), skip what is built, climb down the OOM ladder.

A build that ends INTERNAL_ERROR, or FAILURE with the compiler killed, is the builder running out of memory
(lesson 7: E2_HIGHCPU_32 has 32 GB for 32 compile jobs): it is tried again with half the jobs. Any other
failure fails at once with the build's log URL, its last 40 lines and the fix when it is a known one. The
build's status is always read back: INTERNAL_ERROR can arrive as a returned Build or as an exception
(FACTS.md). Builds run in the target's ``build_region`` ('global' by default): a region Cloud Build restricts the
project from is refused at create, and that refusal names the setting and its fixes (``restricted_region``).
"""

from __future__ import annotations

import re
import subprocess
import tarfile
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

from google.api_core import exceptions as gexc
from google.api_core.operation import Operation
from google.api_core.retry import if_exception_type as retry_if
from google.cloud.devtools import cloudbuild_v1
from prefect import task
from pydantic import BaseModel, Field

from blocks.images import ImageBuild
from blocks.profile import ServingProfile
from blocks.target import GcpTarget
from tasks.common import clients
from tasks.common.gcp import CREATE_RETRY, GCP_RETRY, gcp_errors, wait_for
from tasks.common.logs import run_logger
from tasks.common.naming import repository_host
from tasks.image.build_context import context_files
from tasks.image.images import BuildPlan, build_plan, check_local_source, content_tag, render_build, tree_digest
from tasks.infra import propagation
from tasks.infra.build_identity import BUILD_BUCKET_ROLE, REPOSITORY_ROLE
from tasks.infra.ensure import repository_path
from tasks.infra.propagation import when_visible

Status = cloudbuild_v1.Build.Status
RUNNING = (Status.STATUS_UNKNOWN, Status.PENDING, Status.QUEUED, Status.WORKING)
OOM_MARKERS = ("Killed signal terminated program", "exit code: 137", "exit status 137", "signal 9", "Killed")
KNOWN_FIXES = {
    "the --mount option requires BuildKit": "set DOCKER_BUILDKIT=1 in the docker step's env (lesson 7)",
    "setuptools-scm was unable to detect version": (
        "keep .git in the build context (lesson 8): build from git_url (cloned with .git) or include .git in source_dir"
    ),
    "unknown instruction": "fix the Dockerfile at the line shown",
    "failed to reach build target": "set build.target to a stage name of the Dockerfile (FROM ... AS name)",
    "no such file or directory": "set build.dockerfile to the Dockerfile's path inside the source",
    "name unknown": "create the Artifact Registry repository first (the ensure-infra step does)",
}
SHA = re.compile(r"^[0-9a-f]{40}$")
# What docker push's denial names, whatever its wording (tasks/infra/propagation.py).
UPLOAD_PERMISSION = "artifactregistry.repositories.uploadArtifacts"
# What Cloud Build answers (400 FAILED_PRECONDITION) a project it restricts to a few regions when a build is created
# in another: "failed precondition: due to quota restrictions, cannot run builds in this region. Please contact
# support" (google-github-actions/deploy-cloudrun#480), in later reports "..., see https://cloud.google.com/build/
# docs/locations#restricted_regions_for_some_projects" or "... Cloud Build cannot run builds in this region": the
# part they share. The regions such a project keeps: Cloud Build locations, "Restricted regions for some projects".
RESTRICTED_REGION = "cannot run builds in this region"
UNRESTRICTED_REGIONS = ("us-central1", "us-west2", "europe-west1", "asia-east1", "australia-southeast1",
                        "southamerica-east1")  # fmt: skip
BUILD_CPU_METRIC = "cloudbuild.googleapis.com/concurrent_public_pool_build_cpus"
BUILD_CPU_TITLE = "Concurrent Build CPUs (Regional Default Pool)"


class BuildAttempt(BaseModel):
    max_jobs: int
    build_id: str
    status: str
    log_url: str
    seconds: float


class ImageBuildError(RuntimeError):
    """A build that retrying with fewer jobs cannot fix; the message carries the log URL and its tail."""

    def __init__(self, message: str, attempts: list[BuildAttempt] | None = None) -> None:
        super().__init__(message)
        self.attempts = list(attempts or [])  # what the report lists and links to, each with its log


class ImageResult(BaseModel):
    """The image a revision will run, and how it came to be."""

    image: str = Field(description="Image reference to deploy: by digest when built.")
    tag: str | None = None
    strategy: str = Field(description="prebuilt or build")
    reused: bool = Field(description="Nothing was built: the pin, or an image already built from the same inputs.")
    attempts: list[BuildAttempt] = Field(default_factory=list)


# Source ------------------------------------------------------------------------------------------------------
def _git(*args: str, cwd: Path | None = None) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ImageBuildError(f"git {' '.join(args[:2])} failed: {done.stderr.strip()[-500:]}")
    return done.stdout.strip()


def resolve_git_ref(url: str, ref: str) -> str:
    """The commit sha of ``ref`` without cloning (a sha is its own answer)."""
    if SHA.match(ref):
        return ref
    listed = _git("ls-remote", url, ref, f"refs/tags/{ref}^{{}}")
    lines = [line.split("\t") for line in listed.splitlines() if line]
    peeled = [sha for sha, name in lines if name.endswith("^{}")]  # an annotated tag's commit
    if peeled or lines:
        return (peeled or [lines[0][0]])[0]
    raise ImageBuildError(f"build.git_ref '{ref}' not found in {url}; use a branch, tag or commit sha it has")


def source_digest(build: ImageBuild) -> str:
    folder = check_local_source(build)
    if folder is not None:
        return f"tree:{tree_digest(folder, build.dockerfile)}"
    assert build.git_url and build.git_ref
    return f"git:{build.git_url}@{resolve_git_ref(build.git_url, build.git_ref)}"


def _clone(build: ImageBuild, into: Path) -> Path:
    """A shallow clone at the ref that KEEPS .git: setuptools-scm derives vLLM's version from it (lesson 8)."""
    assert build.git_url and build.git_ref
    if SHA.match(build.git_ref):
        _git("init", "-q", str(into))
        _git("fetch", "-q", "--depth", "1", build.git_url, build.git_ref, cwd=into)
        _git("checkout", "-q", "FETCH_HEAD", cwd=into)
    else:
        _git("clone", "-q", "--depth", "1", "--branch", build.git_ref, build.git_url, str(into))
    return into


def upload_source(target: GcpTarget, build: ImageBuild, plan: BuildPlan) -> bool:
    """Pack the source as tar.gz into the bucket's staging prefix; False when it is already there."""
    bucket = clients.storage(target).bucket(plan.source_bucket)
    blob = bucket.blob(plan.source_object)
    if blob.exists():
        return False
    with tempfile.TemporaryDirectory(prefix="image-source-") as scratch:
        folder = check_local_source(build) or _clone(build, Path(scratch) / "src")
        archive = Path(scratch) / "source.tar.gz"
        with tarfile.open(archive, "w:gz") as tar:
            # Only what docker's build context carries: a project's .venv and caches never reach the image anyway.
            for path in context_files(folder, build.dockerfile):
                tar.add(path, arcname=path.relative_to(folder).as_posix(), recursive=False)
        blob.upload_from_filename(str(archive), content_type="application/gzip")
    return True


# Artifact Registry -------------------------------------------------------------------------------------------
def find_built(target: GcpTarget, build: ImageBuild, tag: str) -> str | None:
    """The digest reference of an image already built with this tag, if Artifact Registry has it."""
    registry = clients.artifact_registry(target)
    name = f"{repository_path(target)}/packages/{build.image_name}/tags/{tag}"
    try:
        found = registry.get_tag(name=name, retry=GCP_RETRY)
    except gexc.NotFound:
        return None
    digest = found.version.rsplit("/", 1)[-1]
    return f"{repository_host(target)}/{build.image_name}@{digest}"


# Cloud Build -------------------------------------------------------------------------------------------------
def _log_tail(target: GcpTarget, build: cloudbuild_v1.Build, lines: int = 40) -> str:
    bucket_path = build.logs_bucket.removeprefix("gs://")
    bucket, _, prefix = bucket_path.partition("/")
    name = f"{prefix}/log-{build.id}.txt" if prefix else f"log-{build.id}.txt"
    try:
        text = clients.storage(target).bucket(bucket).blob(name).download_as_text()
    except gexc.NotFound:
        return "(no log written)"
    return "\n".join(text.splitlines()[-lines:])


class _StillBuilding(Exception):
    """The build has not reached a final status yet (drives the polling retry)."""


def _attempt_build_id(client: cloudbuild_v1.CloudBuildClient, target: GcpTarget, marker: str) -> str | None:
    """The build carrying this attempt's tag, if the create whose answer was lost did create it."""
    request = cloudbuild_v1.ListBuildsRequest(
        project_id=target.project, parent=target.build_location_path, filter=f'tags="{marker}"'
    )  # parent selects the build's region, as on create
    found = client.list_builds(request=request, retry=GCP_RETRY)
    return next((b.id for b in found), None)


def _wait_for_build(client: cloudbuild_v1.CloudBuildClient, target: GcpTarget, build_id: str, timeout: float) -> None:
    """Wait for a build known by id only (its operation was lost with the create's answer)."""
    name = f"{target.build_location_path}/builds/{build_id}"

    def poll() -> None:
        if client.get_build(name=name, retry=GCP_RETRY).status in RUNNING:
            raise _StillBuilding(build_id)

    polling = clients.operation_polling(target)
    polling.with_predicate(retry_if(_StillBuilding)).with_timeout(timeout)(poll)()


def _create_build(client: cloudbuild_v1.CloudBuildClient, target: GcpTarget, request: cloudbuild_v1.Build) -> Operation:
    """``builds.create``; a build identity created moments ago (ensure-infrastructure) is waited for while Cloud
    Build's actAs check cannot see it yet (tasks/infra/propagation.py)."""
    email = request.service_account.rsplit("/", 1)[-1]

    def create() -> Operation:
        return client.create_build(parent=target.build_location_path, build=request, retry=CREATE_RETRY)

    return when_visible(create, email, "Cloud Build") if email else create()


def run_build(target: GcpTarget, build: ImageBuild, plan: BuildPlan, max_jobs: int) -> cloudbuild_v1.Build:
    """Submit one build attempt and wait for it; returns the finished Build whatever its status.

    Creating a build is not idempotent: after a 5xx on the create, the build may or may not exist. Each
    attempt carries a tag of its own, so it is looked up first and submitted again only when it is not there.
    """
    client = clients.cloud_build(target)
    request = render_build(target, build, plan, max_jobs)
    marker = f"attempt-{uuid.uuid4().hex[:16]}"
    request.tags.append(marker)
    timeout = build.timeout_seconds + 600
    with gcp_errors("cloudbuild", "roles/cloudbuild.builds.editor", f"building {plan.tagged}", target):
        # parent alone selects the location (FACTS.md): the target's build_region, 'global' by default.
        try:
            operation = _create_build(client, target, request)
        except (gexc.BadRequest, gexc.FailedPrecondition) as exc:
            if RESTRICTED_REGION in exc.message:
                raise ImageBuildError(f"building {plan.tagged} was refused: {restricted_region(target)}") from None
            fix = _identity_fix(plan, request.service_account, exc.message)
            if fix is None:
                raise
            raise ImageBuildError(f"building {plan.tagged} was refused: {exc.message}; fix: {fix}") from None
        except gexc.ServerError:
            build_id = _attempt_build_id(client, target, marker)
            if build_id is not None:
                _wait_for_build(client, target, build_id, timeout)
                return client.get_build(name=f"{target.build_location_path}/builds/{build_id}", retry=GCP_RETRY)
            operation = _create_build(client, target, request)
        build_id = operation.metadata.build.id
        try:
            finished = wait_for(operation, clients.operation_polling(target), timeout=timeout)
            build_id = finished.id
        except gexc.GoogleAPICallError:
            pass  # a failed build; its status is read back below, whichever way the failure arrived
        return client.get_build(name=f"{target.build_location_path}/builds/{build_id}", retry=GCP_RETRY)


def restricted_region(target: GcpTarget) -> str:
    """Why Cloud Build refuses to build in the target's ``build_region``, and the fixes: what preflight and a refused
    build say (Cloud Build's words, then the setting)."""
    region = target.build_region
    return (
        f"Cloud Build may not run builds in {region} for project {target.project} (FAILED_PRECONDITION 'due to quota "
        f"restrictions, cannot run builds in this region'): Cloud Build restricts some projects, new ones among them, "
        f"to {', '.join(UNRESTRICTED_REGIONS)}; such a project's '{BUILD_CPU_TITLE}' quota is 0 in the others. Fix: "
        + build_region_fix(target)
    )


def build_region_fix(target: GcpTarget) -> str:
    """The fixes of a restricted ``build_region``: the setting first (no request to wait for), then the quota."""
    console = f"https://console.cloud.google.com/iam-admin/quotas?project={target.project}&metric="
    return (
        f"set the target's build_region to 'global' (the default: Cloud Build's global default pool, open to every "
        f"project; the image still goes to the repository in {target.region}) or to one of "
        f"{', '.join(UNRESTRICTED_REGIONS)}; or ask Google for {BUILD_CPU_TITLE} above 0 in {target.build_region} "
        f"({BUILD_CPU_METRIC}, {console}{quote(BUILD_CPU_METRIC)})"
    )


def _is_oom(status: Status, tail: str) -> bool:
    return status == Status.INTERNAL_ERROR or (status == Status.FAILURE and any(m in tail for m in OOM_MARKERS))


def build_image(
    target: GcpTarget,
    build: ImageBuild,
    attempt: Callable[[GcpTarget, ImageBuild, BuildPlan, int], cloudbuild_v1.Build] = run_build,
) -> ImageResult:
    """The image for ``build``: found by its content tag, or built down the max_jobs ladder."""
    log = run_logger()
    tag = content_tag(build, source_digest(build))
    existing = find_built(target, build, tag)
    if existing is not None:
        log.info("image %s:%s already built (%s); no build needed", build.image_name, tag, existing)
        return ImageResult(image=existing, tag=tag, strategy="build", reused=True)
    plan = build_plan(target, build, tag)
    upload_source(target, build, plan)
    attempts: list[BuildAttempt] = []
    ladder = build.ladder
    pauses = propagation.redeploy_pauses()
    number = 0
    while number < len(ladder):
        max_jobs = ladder[number]
        number += 1
        started = time.monotonic()
        finished = attempt(target, build, plan, max_jobs)
        status = Status(finished.status)
        attempts.append(
            BuildAttempt(
                max_jobs=max_jobs,
                build_id=finished.id,
                status=status.name,
                log_url=finished.log_url,
                seconds=round(time.monotonic() - started, 2),
            )
        )
        if status == Status.SUCCESS:
            _log_attempt(number, ladder, attempts[-1], "success")
            digest = next((i.digest for i in finished.results.images if i.digest), "")
            image = f"{plan.image}@{digest}" if digest else plan.tagged
            log.info("built %s with max_jobs=%d after %d attempt(s)", image, max_jobs, len(attempts))
            return ImageResult(image=image, tag=tag, strategy="build", reused=False, attempts=attempts)
        tail = _log_tail(target, finished)
        granted_s = _push_awaits_grant(target, finished, tail)
        if granted_s is not None:
            pause = next(pauses)
            why = (
                f"push denied {granted_s:.0f} s after this run granted the build identity {REPOSITORY_ROLE} on the "
                f"repository (IAM propagation, typically 2 minutes, up to 7 or more): building again in {pause:.0f} s"
            )
            _log_attempt(number, ladder, attempts[-1], why)
            time.sleep(pause)
            number -= 1  # the same rung: the build did not run out of memory
            continue
        if not _is_oom(status, tail):
            _log_attempt(number, ladder, attempts[-1], "failure (not out of memory: no retry)")
            raise ImageBuildError(_failure_message(plan, finished, status, tail), attempts)
        rest = ladder[number:]
        _log_attempt(
            number, ladder, attempts[-1], f"OOM -> next rung max_jobs={rest[0]}" if rest else "OOM, no rung left"
        )
    raise ImageBuildError(
        f"building {plan.tagged} ran out of memory at every max_jobs down to the floor "
        f"({', '.join(str(a.max_jobs) for a in attempts)}): lower build.max_jobs_floor, or use a machine with more "
        f"RAM per core than {build.machine_type}. Last log: {attempts[-1].log_url}",
        attempts,
    )


def _push_awaits_grant(target: GcpTarget, finished: cloudbuild_v1.Build, tail: str) -> float | None:
    """The seconds since this run granted the build's account the writer role on the target's repository (where every
    image of ours is pushed), when the build's log shows the push denied that permission while the grant may still be
    propagating (tasks/infra/propagation.py); else None. Keyed on the grant, not on the denial's wording, which need
    not name the repository."""
    if UPLOAD_PERMISSION not in tail:
        return None
    email = finished.service_account.rsplit("/", 1)[-1]
    granted = propagation.propagating_grant(email, [repository_path(target)])
    return None if granted is None else granted[1]


def _log_attempt(number: int, ladder: list[int], done: BuildAttempt, outcome: str) -> None:
    """One INFO line per ladder rung in the run's logs: which attempt, its build, what came of it and how long."""
    run_logger().info(
        "build attempt %d of %d: max_jobs=%d, build %s: %s (%s) in %.1f s; log: %s",
        number,
        len(ladder),
        done.max_jobs,
        done.build_id,
        outcome,
        done.status,
        done.seconds,
        done.log_url,
    )


def _identity_fix(plan: BuildPlan, account: str, log: str) -> str | None:
    """The grant a build identity lacks, from Cloud Build's log line, as the command that grants it."""
    email = account.rsplit("/", 1)[-1]
    member = f"serviceAccount:{email}"
    if UPLOAD_PERMISSION in log:  # docker push: "denied: Permission ..."
        host, project, repository = plan.image.split("/")[:3]
        location = host.removesuffix("-docker.pkg.dev")
        return (
            f"the build identity {email} may not push to the repository; grant it roles/artifactregistry.writer "
            f"there (the ensure-infrastructure step does): `gcloud artifacts repositories add-iam-policy-binding "
            f"{repository} --project {project} --location {location} --member {member} "
            "--role roles/artifactregistry.writer`"
        )
    if "does not have storage.objects.get access" in log:  # FETCHSOURCE: "AccessDeniedException: 403 ..."
        return _bucket_fix(email, "may not read the build source", plan.source_bucket)
    if "builder service account does not have access to the bucket" in log:  # create: 400 invalid bucket
        return _bucket_fix(email, "may not write the build log", plan.logs_bucket.removeprefix("gs://").split("/")[0])
    return None


def _bucket_fix(email: str, what: str, bucket: str) -> str:
    """Storage Admin on the build bucket: what Cloud Build's docs ask for a user-chosen build account's logs bucket
    (tasks/infra/build_identity.py); objectViewer/objectCreator are not enough at create."""
    return (
        f"the build identity {email} {what}; grant it {BUILD_BUCKET_ROLE} on the build bucket (the "
        f"ensure-infrastructure step does): `gcloud storage buckets add-iam-policy-binding gs://{bucket} "
        f"--member serviceAccount:{email} --role {BUILD_BUCKET_ROLE}`"
    )


def _failure_message(plan: BuildPlan, finished: cloudbuild_v1.Build, status: Status, tail: str) -> str:
    fix = _identity_fix(plan, finished.service_account, tail)
    fix = fix or next((fix for marker, fix in KNOWN_FIXES.items() if marker in tail), None)
    return (
        f"building {plan.tagged} ended {status.name}"
        + (f"; fix: {fix}" if fix else "")
        + f"\nlog: {finished.log_url}\nlast lines:\n{tail}"
    )


def resolve_image(
    target: GcpTarget,
    profile: ServingProfile,
    attempt: Callable[[GcpTarget, ImageBuild, BuildPlan, int], cloudbuild_v1.Build] = run_build,
) -> ImageResult:
    """The profile's image: its pinned prebuilt reference as is, or built (or found built) from its ImageBuild."""
    if profile.image is not None:
        return ImageResult(image=profile.image, strategy="prebuilt", reused=True)
    assert profile.build is not None
    return build_image(target, profile.build, attempt)


cloudbuild_run_build = task(name="cloudbuild_run_build", task_run_name="build max_jobs={max_jobs}")(run_build)
"""One ladder attempt as a Prefect task run, so each attempt shows in the UI with its max_jobs."""
