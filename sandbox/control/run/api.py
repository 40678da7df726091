"""Cloud Run Admin API v2 for services, revisions, operations and IAM, as the REST clients call it.

Paths, JSON and long-running operations follow FACTS.md. A template change makes an immutable revision
whose container really starts (instances.py); the create/update operation finishes when that revision is
ready, or fails with Cloud Run's message while traffic stays on the last serving revision.
"""

from __future__ import annotations

import asyncio
import shutil
import time
import uuid
from dataclasses import dataclass, field
from typing import NoReturn

import httpx
from google.cloud import run_v2
from google.longrunning import operations_pb2
from google.protobuf import any_pb2, json_format
from google.rpc import status_pb2
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import BaseRoute, Route

from sandbox.authz import has_permission
from sandbox.control import ControlContext
from sandbox.control.cloudbuild.image_config import plan_launch
from sandbox.control.errors import GRPC_CODES, GoogleApiError, already_exists, invalid_argument, not_found
from sandbox.control.run import resources as res
from sandbox.control.run.capacity import Footprint, GpuReleases, exceeded, footprint_of
from sandbox.control.run.dependencies import (
    RevisionStartError,
    check_dependencies,
    container_env,
    resolve_image,
    service_account_of,
    unmountable_volume,
)
from sandbox.control.run.egress import Internet
from sandbox.control.run.frontend import FrontEnd, Routing
from sandbox.control.run.gmp_sidecar import GmpSidecar, RunEnvironment, startup_probe_passes
from sandbox.control.run.iam_policy import new_policy, post_policy_method
from sandbox.control.run.images import DRIVERS, GMP_COLLECTOR, image_behaviour
from sandbox.control.run.instances import Instance, InstanceSpec, StartOutcome
from sandbox.control.run.jobs import CloudRunJobs
from sandbox.control.run.scale_in import ScaleIn
from sandbox.control.run.system_lines import StartReason
from sandbox.control.run.throttle import Throttle, revision_capacity
from sandbox.control.run.validation import (
    GPU_LIMIT_KEY,
    check_service,
    check_service_id,
    check_tag,
    has_field,
    ingress_index,
    start_waves,
)
from sandbox.faults import FaultMiddleware, front_end_server
from sandbox.serving import ServedApp, serve_app

State = run_v2.Condition.State
LATEST = run_v2.TrafficTargetAllocationType.TRAFFIC_TARGET_ALLOCATION_TYPE_LATEST
BY_REVISION = run_v2.TrafficTargetAllocationType.TRAFFIC_TARGET_ALLOCATION_TYPE_REVISION
INVOKER = "roles/run.invoker"
PUBLIC_MEMBERS = {"allUsers", "allAuthenticatedUsers"}
# User-settable top-level fields a PATCH without updateMask replaces.
MUTABLE_FIELDS = (
    "description",
    "labels",
    "annotations",
    "client",
    "client_version",
    "ingress",
    "launch_stage",
    "binary_authorization",
    "template",
    "traffic",
    "scaling",
    "invoker_iam_disabled",
    "default_uri_disabled",
    "custom_audiences",
)


@dataclass
class ServiceRecord:
    """A service with its revisions, effective routing and front ends."""

    service_id: str
    service: run_v2.Service
    revisions: dict[str, run_v2.Revision] = field(default_factory=dict)
    fingerprints: dict[str, bytes] = field(default_factory=dict)
    routes: list[tuple[str, int]] = field(default_factory=list)
    tag_routes: dict[str, str] = field(default_factory=dict)
    frontends: dict[str, ServedApp] = field(default_factory=dict)  # "" = the service URL, else the tag
    policy: dict = field(default_factory=new_policy)
    next_generation: int = 1
    pending_faults: list[dict] = field(default_factory=list)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    rollouts: set[asyncio.Task] = field(default_factory=set)
    throttle: Throttle = field(default_factory=Throttle)  # in-flight requests per revision, for all its URLs

    @property
    def public(self) -> bool:
        if self.service.invoker_iam_disabled:
            return True
        return any(
            b.get("role") == INVOKER and PUBLIC_MEMBERS & set(b.get("members", [])) for b in self.policy["bindings"]
        )


class CloudRun(ScaleIn):
    """Services, revisions, operations and IAM policies of one sandbox project."""

    name = "run"

    def __init__(self, ctx: ControlContext) -> None:
        self.ctx = ctx
        self.config = ctx.config
        self.faults = ctx.faults
        # Containers reach storage like gcsfuse does: straight to the backend, not through the API front.
        self.gcs_url = ctx.gcs_emulator_url
        self.state_dir = ctx.state_dir / "run"
        self.services: dict[str, ServiceRecord] = {}
        self.internet = Internet(ctx)  # where containers find the Hub, as their egress allows
        # Deleted services with the monotonic time of deletion: their Direct VPC egress IPs stay reserved in the
        # subnet for a while (Compute asks, see compute/api.py `_serverless_holder`).
        self.deleted_services: dict[str, tuple[ServiceRecord, float]] = {}
        self.operations: dict[str, operations_pb2.Operation] = {}
        self.instances: dict[str, Instance] = {}  # by full revision name
        self.faults_for_new_services: dict[str, list[dict]] = {}  # by service id, for its first revisions
        self._starting: dict[str, asyncio.Task] = {}
        self.releases = GpuReleases(self.config)  # stopped instances' GPUs Cloud Run has not released yet
        self._footprints: dict[str, Footprint] = {}  # by full revision name: what one instance holds
        self._last_active: dict[str, float] = {}  # by full revision name: monotonic time of its last request
        self._in_flight: dict[str, int] = {}  # by full revision name: requests its instance is answering
        self._reaper: asyncio.Task | None = None
        # By revision: its instances that shut down by themselves (liveness probe, container exit), for the admin API.
        self.restarts: dict[str, int] = {}
        self._http: httpx.AsyncClient | None = None
        self.jobs = CloudRunJobs(self)  # jobs, executions and tasks (jobs.py); they share the operations here

    # Routing ----------------------------------------------------------------------------------------------
    def routes(self) -> list[BaseRoute]:
        base = "/v2/projects/{project}/locations/{location}"
        return [
            Route(f"{base}/services", self.list_services, methods=["GET"]),
            Route(f"{base}/services", self.create_service, methods=["POST"]),
            Route(f"{base}/services/{{service}}", self.service_get_or_iam, methods=["GET"]),
            Route(f"{base}/services/{{service}}", self.service_post_iam, methods=["POST"]),
            Route(f"{base}/services/{{service}}", self.update_service, methods=["PATCH"]),
            Route(f"{base}/services/{{service}}", self.delete_service, methods=["DELETE"]),
            Route(f"{base}/services/{{service}}/revisions", self.list_revisions, methods=["GET"]),
            Route(f"{base}/services/{{service}}/revisions/{{revision}}", self.get_revision, methods=["GET"]),
            Route(f"{base}/services/{{service}}/revisions/{{revision}}", self.delete_revision, methods=["DELETE"]),
            Route(f"{base}/operations/{{operation}}", self.get_operation, methods=["GET"]),
            Route(f"{base}/operations/{{operation}}", self.wait_operation, methods=["POST"]),
            Route(f"{base}/operations/{{operation}}", self.delete_operation, methods=["DELETE"]),
            *self.jobs.routes(),
        ]

    def admin_routes(self) -> list[BaseRoute]:
        return [
            Route("/faults", self.admin_instance_faults, methods=["POST"]),
            Route("/logs/{revision}", self.admin_logs, methods=["GET"]),
            Route("/instances", self.admin_instances, methods=["GET"]),
            Route("/idle", self.admin_idle, methods=["POST"]),
            *self.jobs.admin_routes(),
        ]

    def _location(self, request: Request) -> str:
        project, location = request.path_params["project"], request.path_params["location"]
        if project != self.config.project:
            raise GoogleApiError(
                403, f"Permission 'run.services.list' denied on resource 'projects/{project}' (or it may not exist)."
            )
        return f"projects/{project}/locations/{location}"

    def _record(self, request: Request, service_id: str | None = None) -> ServiceRecord:
        parent = self._location(request)
        service_id = service_id or request.path_params["service"]
        record = self.services.get(f"{parent}/services/{service_id}")
        if record is None:
            raise not_found(
                f"Resource '{service_id}' of kind 'SERVICE' in region '{request.path_params['location']}' "
                f"in project '{request.path_params['project']}' does not exist."
            )
        return record

    # Services ---------------------------------------------------------------------------------------------
    async def list_services(self, request: Request) -> JSONResponse:
        parent = self._location(request)
        found = [res.to_dict(r.service) for key, r in self.services.items() if key.startswith(parent + "/")]
        return JSONResponse({"services": found} if found else {})

    async def create_service(self, request: Request) -> JSONResponse:
        parent = self._location(request)
        service_id = request.query_params.get("serviceId", "")
        check_service_id(service_id)
        name = f"{parent}/services/{service_id}"
        if name in self.services:
            raise already_exists(f"Resource '{service_id}' already exists.")
        spec = await self._parse_service(request)
        if spec.name and spec.name != name:
            raise invalid_argument("service.name: must be empty when creating a service")
        validate_only = request.query_params.get("validateOnly") == "true"
        self._validate(spec, service_id, request.path_params["location"])
        if validate_only:
            return self._operation_json(self._new_operation(parent, done_with=spec))
        if not spec.traffic:
            spec.traffic = [run_v2.TrafficTarget(type_=LATEST, percent=100)]
        record = ServiceRecord(service_id=service_id, service=run_v2.Service(name=name, uid=str(uuid.uuid4())))
        record.pending_faults.extend(self.faults_for_new_services.pop(service_id, []))
        self.services[name] = record
        record.frontends[""] = await self._serve_frontend(record, "")
        record.service.uri = record.frontends[""].url
        # Cloud Run lists two URLs: the hash one (uri; here the loopback front end) and the deterministic
        # https://SERVICE-PROJECT_NUMBER.REGION.run.app; ID tokens for either are accepted (frontend.py).
        record.service.urls = [
            record.service.uri,
            f"https://{service_id}-{self.config.project_number}.{request.path_params['location']}.run.app",
        ]
        record.service.create_time = res.now()
        record.service.creator = "sandbox-user@example.com"
        return self._operation_json(await self._apply(record, spec, parent, creating=True))

    async def update_service(self, request: Request) -> JSONResponse:
        parent = self._location(request)
        service_id = request.path_params["service"]
        name = f"{parent}/services/{service_id}"
        spec = await self._parse_service(request)
        record = self.services.get(name)
        if record is None:
            if request.query_params.get("allowMissing") != "true":
                raise not_found(f"Resource '{service_id}' of kind 'SERVICE' does not exist.")
            request.scope["query_string"] = f"serviceId={service_id}".encode()
            return await self.create_service(request)
        if spec.etag and spec.etag != record.service.etag:
            raise GoogleApiError(409, f"Etag mismatch for service '{service_id}'; read it again.", "ABORTED")
        merged = run_v2.Service(record.service)
        mask = [p for p in request.query_params.get("updateMask", "").split(",") if p]
        paths = [_snake(p.split(".")[0]) for p in mask] or list(MUTABLE_FIELDS)
        for path in paths:
            if path not in MUTABLE_FIELDS:
                raise invalid_argument(f"update_mask: field '{path}' cannot be updated")
            setattr(merged, path, getattr(spec, path))
        self._validate(merged, service_id, request.path_params["location"])
        if request.query_params.get("validateOnly") == "true":
            return self._operation_json(self._new_operation(parent, done_with=merged))
        if not merged.traffic:
            merged.traffic = [run_v2.TrafficTarget(type_=LATEST, percent=100)]
        return self._operation_json(await self._apply(record, merged, parent, creating=False))

    async def service_get_or_iam(self, request: Request) -> Response:
        service_id, _, verb = request.path_params["service"].partition(":")
        record = self._record(request, service_id)
        if verb == "getIamPolicy":
            return JSONResponse(record.policy)
        if verb:
            raise not_found(f"Method '{verb}' not found.")
        return JSONResponse(res.to_dict(record.service))

    async def service_post_iam(self, request: Request) -> Response:
        service_id, _, verb = request.path_params["service"].partition(":")
        record = self._record(request, service_id)
        return await post_policy_method(self.ctx, request, verb, record, record.service.name)

    async def delete_service(self, request: Request) -> JSONResponse:
        parent = self._location(request)
        record = self._record(request)
        del self.services[record.service.name]
        for task in record.rollouts:
            task.cancel()
        for revision in record.revisions:
            await self._stop_instance(revision)
        for served in record.frontends.values():
            await served.stop()
        record.service.delete_time = res.now()
        self.deleted_services[record.service.name] = (record, time.monotonic())
        return self._operation_json(self._new_operation(parent, done_with=record.service))

    # Revisions --------------------------------------------------------------------------------------------
    async def list_revisions(self, request: Request) -> JSONResponse:
        record = self._record(request)
        found = [res.to_dict(r) for r in reversed(record.revisions.values())]
        return JSONResponse({"revisions": found} if found else {})

    def _revision(self, request: Request) -> tuple[ServiceRecord, run_v2.Revision]:
        record = self._record(request)
        revision = record.revisions.get(f"{record.service.name}/revisions/{request.path_params['revision']}")
        if revision is None:
            raise not_found(f"Revision '{request.path_params['revision']}' does not exist.")
        return record, revision

    async def get_revision(self, request: Request) -> JSONResponse:
        return JSONResponse(res.to_dict(self._revision(request)[1]))

    async def delete_revision(self, request: Request) -> JSONResponse:
        record, revision = self._revision(request)
        short = revision.name.rsplit("/", 1)[1]
        if any(r == short for r, pct in record.routes if pct) or short in record.tag_routes.values():
            raise GoogleApiError(
                400,
                f"Revision '{short}' is receiving traffic or is tagged; move its traffic first.",
                "FAILED_PRECONDITION",
            )
        del record.revisions[revision.name]
        await self._stop_instance(revision.name)
        return self._operation_json(self._new_operation(self._location(request), done_with=revision))

    # Operations -------------------------------------------------------------------------------------------
    def _new_operation(self, parent: str, done_with=None) -> operations_pb2.Operation:
        op = operations_pb2.Operation(name=f"{parent}/operations/{uuid.uuid4()}")
        if done_with is not None:
            self._finish(op, done_with)
        self.operations[op.name] = op
        return op

    @staticmethod
    def _finish(op: operations_pb2.Operation, result=None, error: GoogleApiError | None = None) -> None:
        if error is not None:
            op.error.CopyFrom(status_pb2.Status(code=GRPC_CODES.get(error.status, 2), message=error.message))
        else:
            packed = any_pb2.Any()
            packed.Pack(type(result).pb(result))
            op.response.CopyFrom(packed)
        op.done = True

    def _operation_json(self, op: operations_pb2.Operation) -> JSONResponse:
        return JSONResponse(json_format.MessageToDict(op))

    def _operation(self, request: Request) -> operations_pb2.Operation:
        name = f"{self._location(request)}/operations/{request.path_params['operation'].partition(':')[0]}"
        op = self.operations.get(name)
        if op is None:
            raise not_found(f"Operation '{name}' does not exist.")
        return op

    async def get_operation(self, request: Request) -> JSONResponse:
        return self._operation_json(self._operation(request))

    async def wait_operation(self, request: Request) -> JSONResponse:
        op = self._operation(request)
        if not request.path_params["operation"].endswith(":wait"):
            raise not_found("Method not found.")
        body = await request.json() if await request.body() else {}
        timeout = float(str(body.get("timeout", "60s")).rstrip("s"))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not op.done and loop.time() < deadline:
            await asyncio.sleep(0.02)
        return self._operation_json(op)

    async def delete_operation(self, request: Request) -> JSONResponse:
        op = self._operation(request)
        del self.operations[op.name]
        return JSONResponse({})

    # Rollout ----------------------------------------------------------------------------------------------
    async def _parse_service(self, request: Request) -> run_v2.Service:
        raw = await request.body()
        try:
            return run_v2.Service.from_json(raw or b"{}")
        except (json_format.ParseError, ValueError) as exc:
            raise invalid_argument(f"Invalid JSON payload received. {exc}") from None

    def _validate(self, spec: run_v2.Service, service_id: str, region: str) -> None:
        check_service(spec, service_id, region, self.config)
        check_dependencies(self.ctx, spec, region)

    async def _apply(
        self, record: ServiceRecord, spec: run_v2.Service, parent: str, creating: bool
    ) -> operations_pb2.Operation:
        """Store the new spec; roll out a new revision if the template changed; finish traffic afterwards."""
        async with record.lock:
            service = record.service
            template = res.with_defaults(spec.template)
            revision_id = template.revision
            existing = f"{service.name}/revisions/{revision_id}" if revision_id else None
            fingerprint = res.template_fingerprint(template)
            if existing and existing in record.revisions and record.fingerprints[existing] != fingerprint:
                raise GoogleApiError(
                    409,
                    f"Revision named '{revision_id}' with different configuration already exists.",
                    "ALREADY_EXISTS",
                )
            current = service.latest_created_revision
            changed = creating or (
                not (existing and existing in record.revisions)
                and (not current or record.fingerprints.get(current) != fingerprint)
            )
            new_revision = None
            if changed:
                revision_id = revision_id or res.new_revision_name(record.service_id, record.next_generation)
                new_revision = f"{service.name}/revisions/{revision_id}"
            self._check_traffic_targets(record, spec, revision_id if changed else None)
            for name in MUTABLE_FIELDS:
                if name != "template":
                    setattr(service, name, getattr(spec, name))
            service.template = spec.template
            service.generation = service.generation + 1
            service.update_time = res.now()
            service.last_modifier = "sandbox-user@example.com"
            service.reconciling = True
            op = self._new_operation(parent)
            if new_revision is not None:
                record.next_generation += 1
                log_uri = f"{self.ctx.control_url}/_sandbox/run/logs/{revision_id}"
                revision = res.revision_from_template(service.name, revision_id, template, log_uri)
                revision.service_account = service_account_of(self.ctx, template)
                record.revisions[new_revision] = revision
                record.fingerprints[new_revision] = fingerprint
                service.latest_created_revision = new_revision
                service.terminal_condition = res.condition("Ready", State.CONDITION_RECONCILING)
                task = asyncio.create_task(self._roll_out(record, new_revision, op))
                record.rollouts.add(task)
                task.add_done_callback(record.rollouts.discard)
            else:
                await self._route(record, op)
            service.etag = res.etag_of(service)
            return op

    def _check_traffic_targets(self, record: ServiceRecord, spec: run_v2.Service, creating: str | None) -> None:
        total, tags = 0, set()
        for target in spec.traffic:
            total += target.percent
            if target.tag:
                check_tag(record.service_id, target.tag)
                if target.tag in tags:
                    raise invalid_argument(f"spec.traffic: tag '{target.tag}' is used more than once")
                tags.add(target.tag)
            if target.type_ == BY_REVISION or target.revision:
                name = f"{record.service.name}/revisions/{target.revision}"
                if target.revision != creating and name not in record.revisions:
                    raise invalid_argument(f"spec.traffic: Revision '{target.revision}' does not exist.")
        if spec.traffic and total != 100:
            raise invalid_argument(f"spec.traffic: percentages must add up to 100, got {total}")

    async def _roll_out(self, record: ServiceRecord, revision_name: str, op: operations_pb2.Operation) -> None:
        revision = record.revisions[revision_name]
        short = revision_name.rsplit("/", 1)[1]
        faults = record.pending_faults.pop(0) if record.pending_faults else {}
        try:
            outcome = await self._start_instance(record, revision, faults, StartReason.DEPLOYMENT_ROLLOUT)
        except RevisionStartError as exc:
            self._fail_revision(record, revision, op, exc.message, exc.reason)
            return
        except Exception as exc:  # a sandbox bug must still end the operation
            self._finish(op, error=GoogleApiError(500, f"sandbox: {exc!r}", "INTERNAL"))
            raise
        ingress = res.ingress_container(revision.containers)
        port = ingress.ports[0].container_port if ingress.ports else res.DEFAULT_PORT
        if outcome is None or not outcome.ready:
            exit_code = outcome.exit_code if outcome else None
            configured = has_field(ingress, "startup_probe")
            message = res.not_ready_message(short, port, revision.log_uri, exit_code, configured)
            self._fail_revision(record, revision, op, message, run_v2.Condition.CommonReason.REVISION_FAILED)
            return
        revision.conditions = [
            res.condition("Ready", State.CONDITION_SUCCEEDED),
            res.condition("ContainerHealthy", State.CONDITION_SUCCEEDED),
            res.condition("ResourcesAvailable", State.CONDITION_SUCCEEDED),
        ]
        revision.reconciling = False
        revision.observed_generation = 1
        record.service.latest_ready_revision = revision_name
        async with record.lock:
            await self._route(record, op)

    def _fail_revision(
        self,
        record: ServiceRecord,
        revision: run_v2.Revision,
        op: operations_pb2.Operation,
        message: str,
        reason: run_v2.Condition.CommonReason,
    ) -> None:
        """Mark the revision and the service failed; routing stays as it was (the old revision keeps serving)."""
        revision.conditions = [
            res.condition(
                "Ready",
                State.CONDITION_FAILED,
                message,
                reason=reason,
                revision_reason=run_v2.Condition.RevisionReason.HEALTH_CHECK_CONTAINER_ERROR
                if reason == run_v2.Condition.CommonReason.REVISION_FAILED
                else None,
            ),
            res.condition("ContainerHealthy", State.CONDITION_FAILED, message),
            res.condition("ResourcesAvailable", State.CONDITION_SUCCEEDED),
        ]
        revision.reconciling = False
        service = record.service
        service.reconciling = False
        service.terminal_condition = res.condition(
            "Ready", State.CONDITION_FAILED, message, reason=run_v2.Condition.CommonReason.REVISION_FAILED
        )
        service.conditions = [
            res.condition("RoutesReady", State.CONDITION_FAILED, message),
            res.condition("ConfigurationsReady", State.CONDITION_FAILED, message),
        ]
        service.observed_generation = service.generation
        self._finish(op, error=GoogleApiError(400, message, "FAILED_PRECONDITION"))

    def _ready(self, revision: run_v2.Revision | None) -> bool:
        return revision is not None and any(
            c.type_ == "Ready" and c.state == State.CONDITION_SUCCEEDED for c in revision.conditions
        )

    async def _route(self, record: ServiceRecord, op: operations_pb2.Operation) -> None:
        """Make the spec's traffic effective, or fail the operation and leave routing as it was."""
        service = record.service
        routes: dict[str, int] = {}
        tags: dict[str, str] = {}
        statuses = []
        for target in service.traffic:
            if target.type_ == LATEST and not target.revision:
                name = service.latest_ready_revision
                short = name.rsplit("/", 1)[1] if name else ""
            else:
                short = target.revision
                name = f"{service.name}/revisions/{short}"
            if not self._ready(record.revisions.get(name)):
                message = f"Revision '{short or '(latest)'}' is not ready and cannot serve traffic."
                service.terminal_condition = res.condition("Ready", State.CONDITION_FAILED, message)
                service.reconciling = False
                self._finish(op, error=GoogleApiError(400, message, "FAILED_PRECONDITION"))
                return
            routes[short] = routes.get(short, 0) + target.percent
            status = run_v2.TrafficTargetStatus(
                type_=target.type_ or BY_REVISION, revision=short, percent=target.percent, tag=target.tag
            )
            if target.tag:
                tags[target.tag] = short
                if target.tag not in record.frontends:
                    record.frontends[target.tag] = await self._serve_frontend(record, target.tag)
                status.uri = record.frontends[target.tag].url
            statuses.append(status)
        for tag in set(record.frontends) - set(tags) - {""}:
            await record.frontends.pop(tag).stop()
        record.routes = list(routes.items())
        record.tag_routes = tags
        service.traffic_statuses = statuses
        service.reconciling = False
        service.observed_generation = service.generation
        service.terminal_condition = res.condition("Ready", State.CONDITION_SUCCEEDED)
        service.conditions = [
            res.condition("RoutesReady", State.CONDITION_SUCCEEDED),
            res.condition("ConfigurationsReady", State.CONDITION_SUCCEEDED),
        ]
        service.etag = res.etag_of(service)
        await self._stop_manually_scaled(record)
        self._finish(op, service)

    # Instances --------------------------------------------------------------------------------------------
    def _instance_spec(self, record: ServiceRecord, revision: run_v2.Revision, faults: dict) -> InstanceSpec:
        container = res.ingress_container(revision.containers)
        behaviour = resolve_image(self.ctx, container.image)
        if behaviour is None:
            raise RevisionStartError(
                f"Image '{container.image}' not found.", run_v2.Condition.CommonReason.CONTAINER_MISSING
            )
        if behaviour.kind == GMP_COLLECTOR:
            # The collector never listens on PORT: as the ingress container it fails its startup probe.
            port = container.ports[0].container_port if container.ports else res.DEFAULT_PORT
            message = res.not_ready_message(
                revision.name.rsplit("/", 1)[1], port, revision.log_uri, None, has_field(container, "startup_probe")
            )
            raise RevisionStartError(message, run_v2.Condition.CommonReason.REVISION_FAILED)
        accelerator = revision.node_selector.accelerator if dict(container.resources.limits).get(GPU_LIMIT_KEY) else ""
        # A built image runs its own ENTRYPOINT/CMD/ENV (recorded by the Cloud Build stand-in), a prebuilt one
        # its known launcher; the container's command/args override them as on Cloud Run.
        builds = self.ctx.module("cloudbuild")
        config = builds.image_config(container.image) if builds is not None else None
        base = image_behaviour(config.base) if config is not None else None
        launch = plan_launch(config, behaviour, base, list(container.command), list(container.args))
        env = {**launch.env, **container_env(self.ctx, container, revision.service_account)}
        real_engine = self.config.engine == "vllm" and not accelerator
        note = ""
        if self.config.engine == "vllm" and accelerator:
            note = f"this revision asks for {accelerator}; the real engine here is CPU-only: the stand-in serves it"
        return InstanceSpec(
            revision=revision.name.rsplit("/", 1)[1],
            argv=launch.argv,
            env=env,
            entrypoint=launch.entrypoint,
            image_cuda=launch.cuda,
            accelerator=accelerator,
            driver_cuda=DRIVERS[accelerator].cuda if accelerator else 0,
            container_port=container.ports[0].container_port if container.ports else res.DEFAULT_PORT,
            probe=res.startup_probe(container),
            liveness=res.liveness_probe(container),
            container_name=container.name,
            mounts=res.gcs_mounts(revision_template_view(revision), container, self.ctx),
            faults=faults,
            engine_venv=self.config.engine_venv if real_engine else None,
            note=note,
        )

    def _mount_failed(
        self, record: ServiceRecord, spec: InstanceSpec, revision: run_v2.Revision, reason: str
    ) -> NoReturn:
        """A volume that never mounts: the container never starts. Cloud Run's own words for it are not public: the
        not-ready message, with the reason in the revision's log."""
        log = self.state_dir / record.service_id / spec.revision
        log.mkdir(parents=True, exist_ok=True)
        with (log / "container.log").open("a") as out:
            out.write(reason + "\n")
        raise RevisionStartError(
            res.not_ready_message(spec.revision, spec.container_port, revision.log_uri, None, True),
            run_v2.Condition.CommonReason.REVISION_FAILED,
        )

    async def _start_instance(
        self, record: ServiceRecord, revision: run_v2.Revision, faults: dict, reason: StartReason
    ) -> StartOutcome | None:
        """Start the revision's containers in dependsOn order: each wave once the previous one passed its startup
        probes (validation.start_waves); the ingress container is the process, sidecars run in-process. Cloud Run
        logs the instance's start, and ``reason`` for it, first."""
        spec = await self.internet.wire(self._instance_spec(record, revision, faults), revision)
        footprint = footprint_of(revision.containers, spec.accelerator)
        self._check_capacity(revision.name, footprint)
        if spec.storage_url is not None and spec.mounts:
            # The Cloud Storage volume's bucket is out of reach (egress.py): the volume never mounts.
            self._mount_failed(record, spec, revision, (
                "[sandbox] the Cloud Storage volume cannot be mounted: storage.googleapis.com is out of reach "
                "(all-traffic VPC egress, no Private Google Access on the subnet, no Cloud NAT)"
            ))  # fmt: skip
        unmountable = unmountable_volume(self.ctx, spec.mounts, revision.service_account)
        if unmountable is not None:
            self._mount_failed(record, spec, revision, unmountable)
        workdir = self.state_dir / record.service_id / spec.revision
        shutil.rmtree(workdir / "root", ignore_errors=True)
        workdir.mkdir(parents=True, exist_ok=True)
        instance = Instance(spec, workdir, self.gcs_url, self.config.time_scale)
        instance.on_ended = lambda ended, _: self._instance_ended(record, revision, ended)
        previous = self.instances.get(revision.name)
        # Registered before any wait, so that a start beside it counts what this one holds.
        self.instances[revision.name] = instance
        self._footprints[revision.name] = footprint
        self._last_active[revision.name] = time.time()
        self._start_reaper()
        if previous is not None:  # a cold restart after a crash: the old instance's sidecars must not run on
            await previous.stop()
        containers = list(revision.containers)
        ingress = ingress_index(containers)
        sidecars = {i: self._sidecar(record, revision, instance, c) for i, c in enumerate(containers) if i != ingress}
        instance.sidecars = list(sidecars.values())
        instance.announce(reason)
        outcome = None
        for wave in start_waves(containers):
            for index in wave:
                if index == ingress:
                    continue
                if not startup_probe_passes(containers[index]):
                    # Cloud Run's words for a sidecar failing its probe are not public: not_ready_message's shape.
                    await instance.stop()  # the whole instance: what started before this wave too
                    self.instances.pop(revision.name, None)
                    short = spec.revision
                    raise RevisionStartError(
                        f"Revision '{short}' is not ready and cannot serve traffic. The user-provided container "
                        f"'{containers[index].name}' failed the configured startup probe checks. Logs for this "
                        f"revision might contain more information.\n\nLogs URL: {revision.log_uri}",
                        run_v2.Condition.CommonReason.REVISION_FAILED,
                    )
                sidecars[index].start()
            if ingress in wave:
                outcome = await instance.start()
                if not outcome.ready:
                    await instance.stop_sidecars()  # those started beside it; later waves never start
                    return outcome
        return outcome

    def _check_capacity(self, revision_name: str, footprint: Footprint) -> None:
        """An instance starts only while the region's quotas hold it beside every running instance and job task
        (capacity.py, with Cloud Run's words and their sources); its revision fails otherwise."""
        refusal = exceeded(self.config, self.held(except_revision=revision_name), self.releases.pending(), footprint)
        if refusal is not None:
            short = revision_name.rsplit("/", 1)[1]
            raise RevisionStartError(
                f"Revision '{short}' is not ready and cannot serve traffic. {refusal}",
                run_v2.Condition.CommonReason.REVISION_FAILED,
            )

    def held(self, except_revision: str = "") -> list[Footprint]:
        """What every running (or starting) instance, but ``except_revision``'s, and every running job task hold."""
        instances = [
            self._footprints[name]
            for name, instance in self.instances.items()
            if name != except_revision and _holds(instance) and name in self._footprints
        ]
        return [*instances, *self.jobs.running_footprints()]

    def _sidecar(
        self, record: ServiceRecord, revision: run_v2.Revision, instance: Instance, container: run_v2.Container
    ) -> GmpSidecar:
        behaviour = resolve_image(self.ctx, container.image)
        if behaviour is None or behaviour.kind != GMP_COLLECTOR:  # admission refuses these (dependencies.py)
            raise RevisionStartError(
                f"Image '{container.image}' not found.", run_v2.Condition.CommonReason.CONTAINER_MISSING
            )
        env = RunEnvironment(
            project=self.config.project,
            location=revision.name.split("/")[3],
            service=record.service_id,
            revision=revision.name.rsplit("/", 1)[1],
            configuration=record.service_id,
            service_account=revision.service_account,
        )
        # The id the instance's log entries carry (container_log.py), so both agree.
        return GmpSidecar(container, env, instance, self.ctx.module("monitoring"), lambda: instance.instance_id)

    async def _instance_url(self, record: ServiceRecord, short: str) -> str | None:
        """The instance serving ``short``; cold-starts one if the revision is routable but scaled to zero."""
        name = f"{record.service.name}/revisions/{short}"
        if short in self._manually_stopped(record):
            return None  # the front end answers 503, as for a revision with no instance
        instance = self.instances.get(name)
        if instance is not None and instance.running:
            self.request_started(name)
            return instance.url
        revision = record.revisions.get(name)
        if not self._ready(revision):
            return None
        task = self._cold_start(record, revision)
        try:
            outcome = await asyncio.shield(task)
        except RevisionStartError:
            return None  # e.g. its secret was revoked since, or the region's quota is held: the front end answers 503
        if not outcome.ready:
            return None
        self.request_started(name)
        return self.instances[name].url

    def _cold_start(
        self, record: ServiceRecord, revision: run_v2.Revision, reason: StartReason = StartReason.AUTOSCALING
    ) -> asyncio.Task:
        """A new instance of ``revision`` (no faults: those were its first instance's), one start at a time."""
        name = revision.name
        task = self._starting.get(name)
        if task is None:
            task = asyncio.create_task(self._start_instance(record, revision, {}, reason))
            self._starting[name] = task
            task.add_done_callback(lambda done: self._started(name, done))
        return task

    def _started(self, name: str, task: asyncio.Task) -> None:
        self._starting.pop(name, None)
        if not task.cancelled():
            task.exception()  # retrieved: a start nobody awaited (a restart) fails quietly, as a cold start does

    async def _instance_ended(self, record: ServiceRecord, revision: run_v2.Revision, instance: Instance) -> None:
        """An instance shut down by itself: its liveness probe failed or its container exited (instances.py logged
        Cloud Run's line). Cloud Run starts a new one in its place ("Liveness probes determine whether to restart a
        container", "Configure container health checks") for a revision that still serves traffic; any other
        revision starts one on its next request, as after a scale-in."""
        name = revision.name
        if self.instances.get(name) is not instance:
            return  # already replaced or stopped
        self.restarts[name] = self.restarts.get(name, 0) + 1
        short = name.rsplit("/", 1)[1]
        routed = record.service.name in self.services and short in self._routed(record)
        if routed and short not in self._manually_stopped(record):
            # A minimum that keeps the revision up is why Cloud Run replaces it; otherwise, its traffic.
            kept = self._kept_warm(record, name)
            self._cold_start(record, revision, StartReason.MIN_INSTANCE if kept else StartReason.AUTOSCALING)

    async def _stop_instance(self, revision_name: str) -> None:
        instance = self.instances.pop(revision_name, None)
        if instance is not None:
            held_gpu = _holds(instance) and instance.spec.accelerator
            await instance.stop()
            if held_gpu:  # its GPU counts against the quota a while longer (config.gpu_release_seconds)
                self.releases.add(instance.spec.accelerator)

    async def _serve_frontend(self, record: ServiceRecord, tag: str) -> ServedApp:
        if self._http is None:
            self._http = httpx.AsyncClient(
                timeout=httpx.Timeout(3600, connect=5),
                limits=httpx.Limits(max_connections=256, max_keepalive_connections=64),
            )

        def may_invoke(principal: str) -> bool:
            return has_permission(self.ctx, principal, "run.routes.invoke", record.service.name)

        def routing() -> Routing | None:
            if record.service.name not in self.services:
                return None
            service = record.service
            # Audiences Cloud Run accepts: the service's own URLs and its custom audiences, never a tag URL.
            audiences = frozenset(a.rstrip("/") for a in [service.uri, *service.urls, *service.custom_audiences])
            if tag:
                revision = record.tag_routes.get(tag)
                return Routing(record.public, [(revision, 100)] if revision else [], audiences, may_invoke)
            return Routing(record.public, list(record.routes), audiences, may_invoke)

        def served(revision: str, status: int, seconds: float) -> None:
            self.request_ended(f"{record.service.name}/revisions/{revision}")
            # Requests that reached an instance, for Cloud Monitoring's request_count / request_latencies.
            monitoring = self.ctx.module("monitoring")
            if monitoring is not None:
                location = record.service.name.split("/")[3]
                instance = self.instances.get(f"{record.service.name}/revisions/{revision}")
                real_time = instance is not None and instance.spec.real_engine
                monitoring.record_request(location, record.service_id, revision, status, seconds, real_time)

        def capacity(short: str):
            name = f"{record.service.name}/revisions/{short}"
            return revision_capacity(record.revisions.get(name), self.instances.get(name))

        def throttled(revision: str, http_request: dict) -> None:
            logging = self.ctx.module("logging")  # the revision's request log (throttle.py)
            if logging is not None:
                logging.record_request(record.service.name.split("/")[3], record.service_id, revision, http_request)

        issuer = self.ctx.identity
        app = FrontEnd(routing, lambda short: self._instance_url(record, short), self._http, issuer, served,
                       capacity, record.throttle, throttled)  # fmt: skip
        server = front_end_server(record.service_id, tag)
        return await serve_app(FaultMiddleware(app, server, self.faults), server)

    async def shutdown(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
        await self.jobs.shutdown()
        for record in self.services.values():
            for task in record.rollouts:
                task.cancel()
            for served in record.frontends.values():
                await served.stop()
        # All at once: one by one, a few hundred instances on a busy host outlast the launcher's patience.
        await asyncio.gather(*(self._stop_instance(name) for name in list(self.instances)))
        if self._http is not None:
            await self._http.aclose()
        await self.internet.close()

    # Admin ------------------------------------------------------------------------------------------------
    async def admin_instance_faults(self, request: Request) -> JSONResponse:
        """``{"service": id, "faults": {...}, "revisions": n}``: the next n revisions start with these faults; for a
        service not created yet, its first n revisions."""
        body = await request.json()
        queued = [body.get("faults", {})] * int(body.get("revisions", 1))
        matches = [r for r in self.services.values() if r.service_id == body.get("service")]
        for record in matches:
            record.pending_faults.extend(queued)
        if not matches:
            self.faults_for_new_services.setdefault(str(body.get("service")), []).extend(queued)
        return JSONResponse({"queued": len(matches) or 1})

    async def admin_logs(self, request: Request) -> Response:
        """The revision's log as its Logs URL shows it: Cloud Logging's entries of the revision, oldest first (the
        container's lines and Cloud Run's own); its container's output file when Logging is not served."""
        short = request.path_params["revision"]
        logging = self.ctx.module("logging")
        if logging is not None and (text := logging.revision_text(short)) is not None:
            return PlainTextResponse(text)
        for name, instance in self.instances.items():
            if name.endswith(f"/revisions/{short}"):
                return PlainTextResponse(instance.log_path.read_text(errors="replace"))
        for path in self.state_dir.glob(f"*/{short}/container.log"):
            return PlainTextResponse(path.read_text(errors="replace"))
        return PlainTextResponse(f"no logs for revision {short}", status_code=404)

    async def admin_idle(self, _: Request) -> JSONResponse:
        """Cloud Run's idle shutdown, now, as if the idle time (``idle_instance_seconds``) and the GPU release
        (``gpu_release_seconds``) had passed: stop the instances no minimum keeps warm (``_kept_warm``) and release
        every GPU. A test that needs the region's quota free of what earlier tests left idle asks for it here.
        Returns the revisions whose instance was stopped."""
        stopped = []
        for name in list(self.instances):
            record = self._record_of(name)
            if record is None or not self._kept_warm(record, name):
                await self._stop_instance(name)
                stopped.append(name)
        self.releases.release_all()
        return JSONResponse({"stopped": stopped})

    async def admin_instances(self, _: Request) -> JSONResponse:
        """Each revision's instance: its ingress process, when it started and passed its startup probe (real epoch
        seconds), how many of the revision's instances shut down by themselves (``restarts``), its volumes as it got
        them (``mounts``, ``writable`` included) and its sidecars' counters (gmp_sidecar.GmpSidecar.status)."""
        return JSONResponse(
            [
                {
                    "revision": name,
                    "running": i.running,
                    "url": i.url,
                    "started_at": i.started_at,
                    "ready_at": i.ready_at,
                    "restarts": self.restarts.get(name, 0),
                    "mounts": i.spec.mounts,
                    "sidecars": [s.status() for s in i.sidecars],
                }
                for name, i in self.instances.items()
            ]
        )


def revision_template_view(revision: run_v2.Revision) -> run_v2.RevisionTemplate:
    """The volume part of a revision and who uses them, in template form (the stand-in's mount table reads it)."""
    return run_v2.RevisionTemplate(volumes=list(revision.volumes), service_account=revision.service_account)


def _snake(name: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in name)


def _holds(instance: Instance) -> bool:
    """Whether ``instance`` holds its resources: registered to start, or its container still running."""
    return instance.process is None or instance.process.returncode is None
