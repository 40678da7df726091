"""Cloud Build API v1 for builds and their long-running operations, as ``cloudbuild_v1``'s REST client calls it.

Paths come from the client's REST transport (FACTS.md): ``POST /v1/projects/{p}/builds`` runs a global build
whose operation is ``operations/build/{p}/{base64 id}``, served here at ``GET /v1/operations/build/...``;
``POST /v1/projects/{p}/locations/{l}/builds`` (``parent`` alone) runs a regional build whose operation lives in
the shared store (``sandbox.control.operations``). Builds are read with ``GET .../builds/{id}``, listed, cancelled
and retried. Requests are parsed and answers rendered with the ``cloudbuild_v1`` types, so the JSON is what the
client expects.

A build runs as a task on the control plane's loop (runner.py) and ends as Cloud Build ends it. The operation
of a FAILURE build ends with error 2 ("Build failed; check build logs for details"), a TIMEOUT with 4, a
cancelled one with 1; SUCCESS returns the Build. INTERNAL_ERROR arrives either way (FACTS.md): by default it
alternates between an error 13 and a returned Build with that status, so callers must read the build's status
back. ``get_build`` always shows the true status. The log is written to the logs bucket before the operation is
marked done. A regional build in one of ``SandboxConfig.build_restricted_regions`` (by default every region a
restricted project may not use) is refused at create with Cloud Build's 400 FAILED_PRECONDITION (RESTRICTED_REGION).
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import json
import logging
import re
import uuid

from google.cloud.devtools import cloudbuild_v1 as cb
from google.longrunning import operations_pb2
from google.protobuf import json_format
from google.rpc import status_pb2
from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import BaseRoute, Route

from sandbox.authz import has_permission
from sandbox.authz.denials import cloud_build_act_as
from sandbox.control import ControlContext
from sandbox.control.cloudbuild.docker import MACHINES
from sandbox.control.cloudbuild.image_config import ImageConfig
from sandbox.control.cloudbuild.runner import BuildRunner, now
from sandbox.control.cloudbuild.state import BuildRecord, BuildSettings, ForcedOutcome, Status
from sandbox.control.cloudbuild.storage import BuildStorage, StorageError, split_gs_url
from sandbox.control.cloudbuild.substitutions import SubstitutionError, apply_substitutions
from sandbox.control.errors import GoogleApiError, invalid_argument, not_found
from sandbox.control.operations import Operations, operation_json, pack, paginate
from sandbox.identity import unique_id

logger = logging.getLogger(__name__)

LoggingMode = cb.BuildOptions.LoggingMode
BucketBehavior = cb.BuildOptions.DefaultLogsBucketBehavior
DEFAULT_TIMEOUT = dt.timedelta(hours=1)  # the proto: "Default time is 60 minutes"
MAX_TIMEOUT = dt.timedelta(hours=24)  # FACTS.md
DEFAULT_QUEUE_TTL = dt.timedelta(hours=1)
MAX_DISK_GB = 4000  # FACTS.md
REGION = re.compile(r"^[a-z]+-[a-z]+[0-9]+$")
PARENT = re.compile(r"^projects/([^/]+)/locations/([^/]+)$")
# gRPC codes of a build's operation error, by final status.
OPERATION_ERRORS = {
    Status.FAILURE: (2, "Build failed; check build logs for details"),
    Status.TIMEOUT: (4, "Build timed out; check build logs for details"),
    Status.CANCELLED: (1, "Operation was cancelled."),  # the shared store's own wording for a cancel
    Status.INTERNAL_ERROR: (13, "Build failed with an internal error; check build logs for details"),
}
STATUS_FOR_ERROR = {2: "UNKNOWN", 13: "INTERNAL"}  # what Operations.fail maps back to these codes
# A project restricted to a few Cloud Build regions (SandboxConfig.build_restricted_regions) is refused a regional
# build elsewhere at create, before the build is admitted: google-github-actions/deploy-cloudrun#480 (gcloud 455+ built
# `run deploy --source` in europe-west2: "ERROR: (gcloud.run.deploy) FAILED_PRECONDITION: failed precondition: due to
# quota restrictions, cannot run builds in this region. Please contact support"; gcloud prints the status, then the
# message). Later reports end the same text with ", see https://cloud.google.com/build/docs/locations#restricted_
# regions_for_some_projects" or say "Cloud Build cannot run builds in this region"; the product keys on the part all
# share. FAILED_PRECONDITION is HTTP 400 in Google's mapping (google.rpc.Code), so google-api-core raises BadRequest.
RESTRICTED_REGION = (
    "failed precondition: due to quota restrictions, cannot run builds in this region. Please contact support"
)
# Output-only Build fields a client may echo back in a create request; the service decides them.
# fmt: off
OUTPUT_ONLY = (
    "name", "id", "project_id", "status", "status_detail", "results", "create_time", "start_time", "finish_time",
    "log_url", "timing", "approval", "warnings", "failure_info", "build_trigger_id", "source_provenance",
)
# fmt: on
FILTER_TERM = re.compile(r'^\s*([a-z_.]+)\s*(=|!=|:|<=|>=|<|>)\s*"?([^"]*?)"?\s*$')
FILTER_KEYS = {"status", "id", "build_id", "tags", "images", "trigger_id", "create_time", "start_time", "finish_time"}


class OutcomesRequest(BaseModel):
    outcomes: list[ForcedOutcome]


class CloudBuild:
    """Builds of the sandbox project, global and regional.

    Python API for other modules and tests: ``build(build_id)`` (the Build, or None) and ``log(build_id)``.
    Admin API under ``/_sandbox/cloudbuild``: ``GET /state``, ``POST /settings`` (see ``BuildSettings``),
    ``POST``/``DELETE /outcomes`` (force the next builds' final status, each consumed by one build) and
    ``GET /logs/{id}``.
    """

    name = "cloudbuild"

    def __init__(self, ctx: ControlContext) -> None:
        self.ctx = ctx
        self.config = ctx.config
        self.settings = BuildSettings()
        self.builds: dict[str, BuildRecord] = {}  # by build id, in creation order
        self.global_operations: dict[str, operations_pb2.Operation] = {}
        self.outcomes: list[ForcedOutcome] = []
        self.internal_errors = 0  # INTERNAL_ERROR builds delivered so far (drives the alternation)
        self._storage: BuildStorage | None = None
        self._tasks: set[asyncio.Task] = set()
        # Built digest -> its image config (ENTRYPOINT, CMD, ENV, base): how Cloud Run starts the image.
        self.image_configs: dict[str, ImageConfig] = {}

    def image_config(self, image: str) -> ImageConfig | None:
        """The config of an image a build here pushed (by digest, or by a tag the registry resolves), else None."""
        digest = image.partition("@")[2]
        if not digest:
            registry = self.ctx.module("artifactregistry")
            found = registry.find_image(image) if registry is not None else None
            digest = found["uri"].partition("@")[2] if found else ""
        return self.image_configs.get(digest)

    @property
    def operations(self) -> Operations:
        ops = self.ctx.module("operations")
        assert ops is not None, "the Cloud Build stand-in needs the shared operations module"
        return ops

    @property
    def storage(self) -> BuildStorage:
        if self._storage is None:
            self._storage = BuildStorage(self.ctx.gcs_emulator_url)
        return self._storage

    @property
    def project_number(self) -> str:
        return str(getattr(self.config, "project_number", "") or "123456789012")

    # Routing ----------------------------------------------------------------------------------------------
    def routes(self) -> list[BaseRoute]:
        global_builds = "/v1/projects/{project}/builds"
        regional_builds = "/v1/projects/{project}/locations/{location}/builds"
        routes: list[BaseRoute] = []
        for base in (global_builds, regional_builds):
            # ":cancel" / ":retry" end the id's segment (Google custom methods): routed before the plain id.
            routes += [
                Route(base, self.create_build, methods=["POST"]),
                Route(base, self.list_builds, methods=["GET"]),
                Route(base + "/{build_id}:cancel", self.cancel_build, methods=["POST"]),
                Route(base + "/{build_id}:retry", self.retry_build, methods=["POST"]),
                Route(base + "/{build_id}", self.get_build, methods=["GET"]),
            ]
        operations = "/v1/operations/build/{project}/{operation}"
        routes += [
            Route(operations + ":cancel", self.cancel_operation, methods=["POST"]),
            Route(operations, self.get_operation, methods=["GET"]),
        ]
        return routes

    def admin_routes(self) -> list[BaseRoute]:
        return [
            Route("/state", self.admin_state, methods=["GET"]),
            Route("/settings", self.admin_settings, methods=["POST"]),
            Route("/outcomes", self.admin_add_outcomes, methods=["POST"]),
            Route("/outcomes", self.admin_clear_outcomes, methods=["DELETE"]),
            Route("/logs/{build_id}", self.admin_logs, methods=["GET"]),
        ]

    async def shutdown(self) -> None:
        for record in self.builds.values():
            if record.task is not None:
                record.task.cancel()
        for task in list(self._tasks):
            task.cancel()
        if self._storage is not None:
            await self._storage.aclose()

    # Python API -------------------------------------------------------------------------------------------
    def build(self, build_id: str) -> cb.Build | None:
        record = self.builds.get(build_id)
        return cb.Build(record.build) if record else None

    def log(self, build_id: str) -> str | None:
        record = self.builds.get(build_id)
        return "\n".join(record.log) + "\n" if record else None

    # Request helpers --------------------------------------------------------------------------------------
    def _project(self, project: str) -> str:
        if project not in (self.config.project, self.project_number):
            raise GoogleApiError(403, "The caller does not have permission", "PERMISSION_DENIED")
        return self.config.project

    def _location(self, request: Request) -> tuple[str, bool]:
        """(location, regional) of a builds call: the path's location, a ``parent`` query, or global."""
        self._project(request.path_params["project"])
        location = request.path_params.get("location")
        if location is None and request.query_params.get("parent"):
            match = PARENT.match(request.query_params["parent"])
            if match is None:
                raise invalid_argument(f"invalid parent {request.query_params['parent']!r}")
            self._project(match[1])
            location = match[2]
        if location is None:
            return "global", False
        if location != "global" and not REGION.match(location):
            raise invalid_argument(
                f'Location "{location}" is not supported by Cloud Build: use "global" or a region such as us-central1.'
            )
        return location, True

    def _record(self, request: Request) -> BuildRecord:
        location, _ = self._location(request)
        record = self.builds.get(request.path_params["build_id"])
        if record is None or record.location != location:
            raise not_found("Requested entity was not found.")
        return record

    @staticmethod
    def _build_json(build: cb.Build) -> dict:
        return json_format.MessageToDict(cb.Build.pb(build))

    @staticmethod
    async def _parse_build(request: Request) -> cb.Build:
        raw = await request.body()
        try:
            return cb.Build.from_json(raw or b"{}", ignore_unknown_fields=False)
        except (json_format.ParseError, ValueError) as exc:
            raise invalid_argument(f"Invalid JSON payload received. {exc}") from None

    # Builds -----------------------------------------------------------------------------------------------
    async def create_build(self, request: Request) -> JSONResponse:
        location, regional = self._location(request)
        spec = await self._parse_build(request)
        return JSONResponse(operation_json(await self._start(spec, location, regional)))

    async def retry_build(self, request: Request) -> JSONResponse:
        record = self._record(request)
        assert record.request is not None
        op = await self._start(cb.Build(record.request), record.location, record.regional)
        return JSONResponse(operation_json(op))

    async def get_build(self, request: Request) -> JSONResponse:
        return JSONResponse(self._build_json(self._record(request).build))

    async def list_builds(self, request: Request) -> JSONResponse:
        location, _ = self._location(request)
        matches = _build_filter(request.query_params.get("filter", ""))
        found = [r.build for r in reversed(self.builds.values()) if r.location == location and matches(r.build)]
        page, token = paginate(found, request, default_size=50)
        body: dict = {"builds": [self._build_json(b) for b in page]} if page else {}
        if token:
            body["nextPageToken"] = token
        return JSONResponse(body)

    async def cancel_build(self, request: Request) -> JSONResponse:
        record = self._record(request)
        if not record.final:
            if record.regional:
                # The shared store calls back _on_operation_cancel, then ends the operation CANCELLED.
                self.operations.cancel(record.operation)
            else:
                self._cancel(record)
                self._complete(record)
        return JSONResponse(self._build_json(record.build))

    async def _start(self, spec: cb.Build, location: str, regional: bool) -> operations_pb2.Operation:
        """Admit a build (or refuse it with 400), create its operation and start running it."""
        if location in self.config.build_restricted_regions:
            # Only a region can be restricted: the global location (legacy path or locations/global) always runs.
            raise GoogleApiError(400, RESTRICTED_REGION, "FAILED_PRECONDITION")
        build = await self._admit(spec, location)
        record = BuildRecord(build=build, location=location, operation="", regional=regional, request=cb.Build(spec))
        if self.outcomes:
            record.forced = self.outcomes.pop(0)
            if record.forced == "AUTO":
                record.forced = None
        metadata = cb.BuildOperationMetadata(build=build)
        if regional:
            op = self.operations.create(
                f"projects/{self.config.project}/locations/{location}", metadata, self._on_operation_cancel
            )
        else:
            encoded = base64.urlsafe_b64encode(build.id.encode()).decode()
            op = operations_pb2.Operation(name=f"operations/build/{self.config.project}/{encoded}")
            op.metadata.CopyFrom(pack(metadata))
            self.global_operations[op.name] = op
        record.operation = op.name
        self.builds[build.id] = record
        record.task = asyncio.create_task(self._drive(record))
        return op

    async def _admit(self, spec: cb.Build, location: str) -> cb.Build:
        """The build as Cloud Build stores it, or GoogleApiError 400 with Cloud Build's reason."""
        build = cb.Build(spec)
        for output_only in OUTPUT_ONLY:
            delattr(build, output_only)
        if not build.steps:
            raise invalid_argument("invalid build: build must have at least one step")
        for index, step in enumerate(build.steps):
            if not step.name.strip():
                raise invalid_argument(f"invalid build: build step {index} must specify a name")
        build_id = str(uuid.uuid4())
        account = build.service_account or (
            f"projects/{self.config.project}/serviceAccounts/{self.project_number}-compute@developer.gserviceaccount.com"
        )
        email = account.rsplit("/", 1)[-1]
        try:
            apply_substitutions(
                build,
                {
                    "PROJECT_ID": self.config.project,
                    "PROJECT_NUMBER": self.project_number,
                    "BUILD_ID": build_id,
                    "LOCATION": location,
                    "SERVICE_ACCOUNT_EMAIL": email,
                    "SERVICE_ACCOUNT": account,
                },
            )
        except SubstitutionError as exc:
            raise invalid_argument(f"invalid build: {exc}") from None
        if "timeout" not in build:
            build.timeout = DEFAULT_TIMEOUT
        elif build.timeout > MAX_TIMEOUT or build.timeout <= dt.timedelta(0):
            raise invalid_argument(f"invalid build: timeout must be between 1s and 24h, got {build.timeout}")
        if "queue_ttl" not in build:
            build.queue_ttl = DEFAULT_QUEUE_TTL
        try:
            machine = cb.BuildOptions.MachineType(build.options.machine_type).name
        except ValueError:
            machine = ""
        if machine not in MACHINES:
            raise invalid_argument(f"invalid build: unknown machine type {build.options.machine_type}")
        if build.options.disk_size_gb > MAX_DISK_GB:
            raise invalid_argument(f"invalid build: disk_size_gb must be at most {MAX_DISK_GB}")
        await self._check_identity_and_logs(build, email)
        await self._resolve_source(build)
        build.id = build_id
        build.name = f"projects/{self.config.project}/locations/{location}/builds/{build_id}"
        build.project_id = self.config.project
        build.status = Status.QUEUED
        build.create_time = now()
        build.service_account = account
        build.log_url = (
            f"https://console.cloud.google.com/cloud-build/builds;region={location}/{build_id}"
            f"?project={self.project_number}"
        )
        return build

    async def _check_identity_and_logs(self, build: cb.Build, email: str) -> None:
        options = build.options
        cloud_only = options.logging in (LoggingMode.CLOUD_LOGGING_ONLY, LoggingMode.STACKDRIVER_ONLY, LoggingMode.NONE)
        if build.service_account:
            if (
                not build.logs_bucket
                and not cloud_only
                and options.default_logs_bucket_behavior != BucketBehavior.REGIONAL_USER_OWNED_BUCKET
            ):
                # Cloud Build's 400 word for word (cert-manager PR 8851, in28minutes/course-material PR 11,
                # terraform-google-dataplex-auto-data-quality PR 39; gcloud and the console add "invalid argument").
                raise invalid_argument(
                    "if 'build.service_account' is specified, the build must either (a) specify "
                    "'build.logs_bucket', (b) use the REGIONAL_USER_OWNED_BUCKET "
                    "build.options.default_logs_bucket_behavior option, or (c) use either CLOUD_LOGGING_ONLY / NONE "
                    "logging options"
                )
            iam = self.ctx.module("iam")
            own = email.endswith(f"@{self.config.project}.iam.gserviceaccount.com") or email.startswith(
                f"{self.project_number}-compute@"
            )
            if iam is not None and own and not iam.exists(email):
                raise invalid_argument(f"invalid build: service account {email} does not exist")
            if iam is not None and own and not iam.visible(email):
                # An account created moments ago: Cloud Build's actAs check on it cannot see it yet and refuses
                # the create as it refuses a caller without actAs (PERMISSION_DENIED "caller does not have
                # permission to act as service account ..."), until IAM has propagated it.
                # GoogleCloudPlatform/cloud-run-mcp PR 91 (a new project: cloudBuild.createBuild failed with
                # PERMISSION_DENIED five times, then the build started) and issue 6; DefangLabs/pulumi-defang
                # issue 115 (a build as a just-created build account refused at create, passing on a rerun).
                raise GoogleApiError(403, cloud_build_act_as(self.config.project, unique_id(email)))
        if build.logs_bucket:
            bucket, _ = split_gs_url(build.logs_bucket)
            # Google's "Store and manage build logs" page (cloud.google.com/build/docs/securing-builds/
            # store-view-build-logs, "Store build logs in a user-created bucket", IAM permissions): only the legacy
            # Cloud Build account in the bucket's project needs no grant; any other build account needs the Storage
            # Admin role on the bucket. Which permission Cloud Build actually tests is not documented: our reading
            # is storage.buckets.get + storage.objects.create, both in Storage Admin, and buckets.get in neither
            # objectCreator nor objectViewer, so those two roles alone are refused as the doc implies.
            writable = all(
                has_permission(self.ctx, f"serviceAccount:{email}", permission, f"projects/_/buckets/{bucket}")
                for permission in ("storage.buckets.get", "storage.objects.create")
            )
            if not writable or not await self.storage.bucket_exists(bucket):
                # Checked at create time, before the build runs; the build's identity writes the log (google/trillian
                # PR 2349: 'invalid bucket "trillian-cloudbuild-logs"; builder service account does not have access
                # to the bucket').
                raise invalid_argument(
                    f'invalid bucket "{bucket}"; builder service account does not have access to the bucket'
                )
        elif options.logging not in (LoggingMode.CLOUD_LOGGING_ONLY, LoggingMode.STACKDRIVER_ONLY, LoggingMode.NONE):
            # Cloud Build's default logs bucket, created on first use as Google does.
            default = f"{self.project_number}.cloudbuild-logs.googleusercontent.com"
            await self.storage.ensure_bucket(default, self.config.project)
            build.logs_bucket = f"gs://{default}"

    async def _resolve_source(self, build: cb.Build) -> None:
        """Pin the storage source's generation, or refuse the build as Cloud Build does ("could not resolve")."""
        source = build.source
        for unsupported in ("repo_source", "git_source", "connected_repository", "storage_source_manifest"):
            if unsupported in source:
                raise invalid_argument(f"sandbox: source.{unsupported} is not supported; use source.storage_source")
        if "storage_source" not in source:
            return
        storage = source.storage_source
        if not storage.bucket or not storage.object_:
            raise invalid_argument("invalid build: source.storage_source needs bucket and object")
        email = build.service_account.rsplit("/", 1)[-1]
        if email and not has_permission(
            self.ctx, f"serviceAccount:{email}", "storage.objects.get", f"projects/_/buckets/{storage.bucket}"
        ):
            # Cloud Build reads the source as the build's account, at create: refused, the create answers 400
            # with Cloud Storage's 403 inside, also while a grant just made has not propagated (DefangLabs/
            # pulumi-defang issue 115, doughayden/answer-app's README; the wording of google/mcp-security issue 132).
            raise invalid_argument(
                f"could not resolve source: googleapi: Error 403: {email} does not have storage.objects.get access "
                "to the Google Cloud Storage object. Permission 'storage.objects.get' denied on resource (or it may "
                "not exist)., forbidden"
            )
        generation = await self.storage.object_generation(storage.bucket, storage.object_, storage.generation)
        if generation is None:
            if not await self.storage.bucket_exists(storage.bucket):
                reason = "The specified bucket does not exist."
            else:
                reason = f"No such object: {storage.bucket}/{storage.object_}"
            raise invalid_argument(f"could not resolve source: googleapi: Error 404: {reason}, notFound")
        build.source_provenance.resolved_storage_source = cb.StorageSource(
            bucket=storage.bucket, object_=storage.object_, generation=generation
        )

    # Running and ending -----------------------------------------------------------------------------------
    async def _drive(self, record: BuildRecord) -> None:
        principal = "serviceAccount:" + record.build.service_account.rsplit("/", 1)[-1]
        runner = BuildRunner(
            record,
            self.settings,
            self.config.time_scale,  # read when the build starts
            self.storage,
            self.ctx.module("artifactregistry"),
            self.config.project,
            lambda: self._publish(record),
            # The build runs as its service account (else the Compute default account, Cloud Build docs "Cloud
            # Build service account changes", 2024): what it may read and push is that identity's, not the caller's.
            allowed=lambda permission, resource: has_permission(self.ctx, principal, permission, resource),
            image_configs=self.image_configs,
            image_home=str(self.ctx.state_dir / "cloudbuild" / "images"),
        )
        try:
            await runner.run()
        except asyncio.CancelledError:
            raise  # a cancel (or shutdown) already ended the build
        except Exception as exc:  # a sandbox bug must still end the build and its operation
            logger.exception("cloudbuild: build %s crashed", record.build.id)
            record.log.append(f"ERROR: sandbox: {exc!r}")
            record.build.status = Status.INTERNAL_ERROR
            record.build.status_detail = f"sandbox: {exc!r}"
            record.build.finish_time = now()
        # The log is in the bucket before the operation says done: a caller that reads it at once finds it.
        await self._write_log(record)
        self._complete(record)

    def _cancel(self, record: BuildRecord) -> None:
        """Stop a running build: CANCELLED, its running step too. The operation is ended by the caller."""
        if record.final:
            return
        if record.task is not None:
            record.task.cancel()
        build = record.build
        for step in build.steps:
            if step.status == Status.WORKING:
                step.status = Status.CANCELLED
                step.timing.end_time = now()
        build.status = Status.CANCELLED
        build.status_detail = "Build was cancelled."
        record.delivered_as = "error"  # its operation ends CANCELLED (code 1)
        build.finish_time = now()
        record.log.append("CANCELLED")
        self._publish(record)
        task = asyncio.create_task(self._write_log(record))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _on_operation_cancel(self, name: str) -> None:
        for record in self.builds.values():
            if record.operation == name:
                self._cancel(record)

    def _publish(self, record: BuildRecord) -> None:
        """Refresh the operation's metadata with the build as it is now."""
        metadata = cb.BuildOperationMetadata(build=record.build)
        op = self.global_operations.get(record.operation)
        if op is None:
            self.operations.update_metadata(record.operation, metadata)
        elif not op.done:
            op.metadata.CopyFrom(pack(metadata))

    def _complete(self, record: BuildRecord) -> None:
        """End the build's operation as its final status says (module docstring)."""
        build = record.build
        self._publish(record)
        error = OPERATION_ERRORS.get(Status(build.status))
        if build.status == Status.INTERNAL_ERROR:
            delivery = self.settings.internal_error_delivery
            self.internal_errors += 1
            as_error = delivery == "error" or (delivery == "alternate" and self.internal_errors % 2 == 1)
            error = error if as_error else None
        record.delivered_as = "error" if error else "response"
        if record.regional:
            ops = self.operations
            if error is None:
                ops.finish(record.operation, cb.Build(build))
            else:
                ops.fail_with_code(record.operation, error[0], error[1])
            return
        op = self.global_operations[record.operation]
        if op.done:
            return
        if error is None:
            op.response.CopyFrom(pack(cb.Build(build)))
        else:
            op.error.CopyFrom(status_pb2.Status(code=error[0], message=error[1]))
        op.done = True

    async def _write_log(self, record: BuildRecord) -> None:
        if not record.build.logs_bucket:
            return
        bucket, prefix = split_gs_url(record.build.logs_bucket)
        name = f"{prefix}/log-{record.build.id}.txt" if prefix else f"log-{record.build.id}.txt"
        try:
            await self.storage.upload_text(bucket, name, "\n".join(record.log) + "\n")
        except (StorageError, OSError) as exc:  # e.g. the bucket was deleted meanwhile: the build still ends
            logger.warning("cloudbuild: could not write the log of %s: %s", record.build.id, exc)

    # Operations of global builds --------------------------------------------------------------------------
    def _global_operation(self, request: Request) -> operations_pb2.Operation:
        self._project(request.path_params["project"])
        name = f"operations/build/{self.config.project}/{request.path_params['operation']}"
        op = self.global_operations.get(name)
        if op is None:
            raise not_found(f"Operation '{name}' not found.")
        return op

    async def get_operation(self, request: Request) -> JSONResponse:
        return JSONResponse(operation_json(self._global_operation(request)))

    async def cancel_operation(self, request: Request) -> JSONResponse:
        op = self._global_operation(request)
        record = next((r for r in self.builds.values() if r.operation == op.name), None)
        if record is not None and not record.final:
            self._cancel(record)
            self._complete(record)
        return JSONResponse({})

    # Admin ------------------------------------------------------------------------------------------------
    async def admin_state(self, _: Request) -> JSONResponse:
        return JSONResponse(
            {
                "settings": self.settings.model_dump(),
                "outcomes": list(self.outcomes),
                "internalErrors": self.internal_errors,
                "builds": [
                    {
                        "id": r.build.id,
                        "location": r.location,
                        "operation": r.operation,
                        "forced": r.forced,
                        "deliveredAs": r.delivered_as,
                        "build": self._build_json(r.build),
                    }
                    for r in self.builds.values()
                ],
            }
        )

    async def admin_settings(self, request: Request) -> JSONResponse:
        """``{build_seconds?, queue_seconds?, memory_per_job_gb?, internal_error_delivery?}``; returns all settings."""
        try:
            body = json.loads(await request.body() or b"{}")
            self.settings = BuildSettings.model_validate({**self.settings.model_dump(), **body})
        except (ValueError, ValidationError) as exc:
            detail = exc.errors(include_url=False) if isinstance(exc, ValidationError) else str(exc)
            return JSONResponse({"error": detail}, status_code=400)
        return JSONResponse(self.settings.model_dump())

    async def admin_add_outcomes(self, request: Request) -> JSONResponse:
        """``{"outcomes": ["INTERNAL_ERROR", ...]}``: the next builds end so ("AUTO": as they would).

        "OOM_KILLED" ends a build FAILURE with its compiler's OOM kill in the log (state.ForcedOutcome).
        """
        try:
            body = OutcomesRequest.model_validate_json(await request.body() or b"{}")
        except ValidationError as exc:
            return JSONResponse({"error": exc.errors(include_url=False)}, status_code=400)
        self.outcomes.extend(body.outcomes)
        return JSONResponse({"outcomes": list(self.outcomes)})

    async def admin_clear_outcomes(self, _: Request) -> JSONResponse:
        self.outcomes.clear()
        return JSONResponse({"outcomes": []})

    async def admin_logs(self, request: Request) -> Response:
        text = self.log(request.path_params["build_id"])
        if text is None:
            return PlainTextResponse(f"no build {request.path_params['build_id']}", status_code=404)
        return PlainTextResponse(text)


def _build_filter(text: str):
    """Cloud Build's list filter for ``key=value`` terms joined by AND; other syntax is refused, not ignored."""
    if not text.strip():
        return lambda _build: True
    checks = []
    for term in re.split(r"\s+AND\s+", text.strip()):
        match = FILTER_TERM.match(term)
        if match is None or match[1] not in FILTER_KEYS:
            raise invalid_argument(
                f"sandbox: unsupported filter {text!r} (terms 'key=\"value\"' joined by AND; keys: "
                f"{', '.join(sorted(FILTER_KEYS))})"
            )
        checks.append((match[1], match[2], match[3]))

    def values(build: cb.Build, key: str) -> list[str]:
        if key == "status":
            return [Status(build.status).name]
        if key in ("id", "build_id"):
            return [build.id]
        if key == "tags":
            return list(build.tags)
        if key == "images":
            return [*build.images, *(i.name for i in build.results.images)]
        if key == "trigger_id":
            return [build.build_trigger_id]
        stamp = getattr(build, key)
        return [stamp.isoformat() if stamp else ""]

    def compare(found: str, op: str, wanted: str, key: str) -> bool:
        if key.endswith("_time"):
            if not found:
                return False
            left = dt.datetime.fromisoformat(found.replace("Z", "+00:00"))
            right = dt.datetime.fromisoformat(wanted.replace("Z", "+00:00"))
            return {
                "=": left == right,
                "!=": left != right,
                "<": left < right,
                ">": left > right,
                "<=": left <= right,
                ">=": left >= right,
                ":": left == right,
            }[op]
        if op in ("=", ":"):
            return found == wanted
        if op == "!=":
            return found != wanted
        raise invalid_argument(f"sandbox: operator {op!r} is only supported for *_time keys")

    def matches(build: cb.Build) -> bool:
        for key, op, wanted in checks:
            found = values(build, key)
            if op == "!=":
                if not all(compare(f, op, wanted, key) for f in found):
                    return False
            elif not any(compare(f, op, wanted, key) for f in found):
                return False
        return True

    return matches
