"""Cloud Run jobs (Admin API v2): jobs, their executions and tasks, as prefect-gcp's worker and the REST clients call
them. Paths, bodies and answers follow the discovery document (run.v2.json), which the conformance middleware holds
every request and response to; permissions are sandbox.authz's (run.jobs.*, run.executions.*, run.tasks.*, and actAs
on the job's service account when a job is created or changed).

Running a job makes an execution of ``taskCount`` tasks, at most ``parallelism`` at a time, each retried up to
``maxRetries`` times, each attempt under the task ``timeout`` (job_tasks.py runs one as a local process). Sources:
- run.v2 reference, ExecutionTemplate / TaskTemplate: taskCount defaults to 1; "parallelism ... if this field is 0 or
  unset, the maximum possible value will be used"; maxRetries "Defaults to 3"; timeout "Defaults to 600 seconds".
- Cloud Run docs, "Container runtime contract" (jobs): the env CLOUD_RUN_JOB, CLOUD_RUN_EXECUTION,
  CLOUD_RUN_TASK_INDEX, CLOUD_RUN_TASK_ATTEMPT and CLOUD_RUN_TASK_COUNT.
- prefect-gcp 0.6.22, workers/cloud_run_v2.py and models/cloud_run_v2.py, what the worker reads: a job's
  ``terminalCondition`` Ready, ``latestCreatedExecution`` (present, ``{}`` before the first run), ``etag`` and a
  string ``generation``; jobs.run's Operation ``metadata.name``; an execution's ``parallelism``, ``taskCount``,
  ``logUri`` and ``etag`` (all read as required keys), ``completionTime`` and then a ``Completed`` condition.
- Condition texts: see ``completed_condition``. The jobs.run operation ends with the execution: its Execution as
  ``response`` when it succeeded or was cancelled, ``error`` (code 13, the failed task's message) when it failed
  (``_finish``).

The job's identity: every task gets a metadata server of its own that answers as the job's service account (its
access tokens act as that account in every sandbox API), so a flow run in a job is refused what the account is not
granted. Its container's output lands in Cloud Logging (sandbox/control/logging, resource cloud_run_job), which the
execution's logUri queries; ``/_sandbox/run/executions/{execution}/logs`` shows it as plain text.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import secrets
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote

from google.cloud import run_v2
from google.longrunning import operations_pb2
from google.protobuf import duration_pb2, json_format
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import BaseRoute, Route

from sandbox.control.cloudbuild.image_config import HOST_ONLY_ENV, ImageConfig
from sandbox.control.cloudbuild.image_env import ImageEnvironment, ImageEnvironmentError
from sandbox.control.errors import GoogleApiError, already_exists, invalid_argument, not_found
from sandbox.control.run import resources as res
from sandbox.control.run.capacity import Footprint, exceeded, footprint_of
from sandbox.control.run.dependencies import (
    RevisionStartError,
    check_account_visible,
    container_env,
    resolve_image,
    service_account_of,
)
from sandbox.control.run.iam_policy import new_policy, post_policy_method
from sandbox.control.run.job_images import image_environment
from sandbox.control.run.job_tasks import AttemptResult, AttemptSpec, TaskAttempt
from sandbox.control.run.validation import DEFAULT_CPU, DEFAULT_MEMORY, check_container_sizes, has_field
from sandbox.metadata import RequireFlavor, build_metadata_app
from sandbox.serving import ServedApp, serve_app

if TYPE_CHECKING:
    from sandbox.control.run.api import CloudRun

State = run_v2.Condition.State
Reason = run_v2.Condition.ExecutionReason
# Job names: "must use only lowercase alphanumeric characters and dashes, cannot begin or end with a dash, and cannot
# be longer than 63 characters" (gcloud run jobs create; prefect-gcp caps its names at 63 for this reason).
JOB_ID = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
DEFAULT_TASK_COUNT = 1
DEFAULT_MAX_RETRIES = 3
DEFAULT_TASK_TIMEOUT_S = 600
# Execution names are "<job>-<5 characters>"; every suffix seen (planqtn-jobs-hkk8p, screenshot-demo2-w4gtf, ...) fits
# the Kubernetes random-name alphabet, vowels and look-alikes left out.
EXECUTION_SUFFIX = "bcdfghjklmnpqrstvwxz2456789"
# Mutable top-level Job fields a PATCH replaces (run.v2 Job: the rest is output only).
JOB_FIELDS = ("labels", "annotations", "client", "client_version", "launch_stage", "binary_authorization", "template")


@dataclass
class TaskRecord:
    task: run_v2.Task
    attempt: TaskAttempt | None = None  # the one running or last run
    holding: bool = False  # an attempt runs: the task's vCPU and memory count against the region's quotas


@dataclass
class ExecutionRecord:
    execution: run_v2.Execution
    operation: operations_pb2.Operation
    folder: Path
    tasks: list[TaskRecord] = field(default_factory=list)
    runner: asyncio.Task | None = None
    metadata: ServedApp | None = None
    stop_requested: asyncio.Event = field(default_factory=asyncio.Event)  # cancelled or deleted
    environment: ImageEnvironment | None = None  # the image's Python environment, when its build made one

    @property
    def running(self) -> bool:
        return not self.execution.completion_time

    @property
    def stopping(self) -> bool:
        return self.stop_requested.is_set()


@dataclass
class JobRecord:
    job_id: str
    job: run_v2.Job
    executions: dict[str, ExecutionRecord] = field(default_factory=dict)  # by full name, oldest first
    policy: dict = field(default_factory=new_policy)


def check_job_id(job_id: str) -> None:
    if not job_id:
        raise invalid_argument("job_id: required")
    if not JOB_ID.match(job_id):
        raise invalid_argument(
            f"job_id '{job_id}': must use only lowercase alphanumeric characters and dashes, cannot begin or end "
            "with a dash, must begin with a letter and cannot be longer than 63 characters"
        )


def timeout_seconds(template: run_v2.TaskTemplate) -> float:
    return template.timeout.total_seconds() if has_field(template, "timeout") else DEFAULT_TASK_TIMEOUT_S


def with_job_defaults(template: run_v2.ExecutionTemplate) -> run_v2.ExecutionTemplate:
    """The execution template as Cloud Run stores it: task count, retries and timeout filled in."""
    template = run_v2.ExecutionTemplate(template)
    if not template.task_count:
        template.task_count = DEFAULT_TASK_COUNT
    task = template.template
    if not has_field(task, "max_retries"):
        task.max_retries = DEFAULT_MAX_RETRIES
    if not has_field(task, "timeout"):
        task.timeout = duration_pb2.Duration(seconds=DEFAULT_TASK_TIMEOUT_S)
    for index, container in enumerate(task.containers):
        limits = dict(container.resources.limits)
        limits.setdefault("cpu", DEFAULT_CPU)
        limits.setdefault("memory", DEFAULT_MEMORY)
        container.resources.limits = limits
        if not container.name and len(task.containers) > 1:
            container.name = f"container-{index + 1}"
    return template


def container_argv(config: ImageConfig | None, command: list[str], args: list[str]) -> list[str]:
    """The container's process as docker runs an image and Cloud Run overrides it (``command`` replaces the
    ENTRYPOINT, ``args`` the CMD; a shell-form ENTRYPOINT ignores both arguments and CMD)."""
    if command:
        return [*command, *args]
    entrypoint = list(config.entrypoint or ()) if config is not None else []
    run_args = list(args) if args else list(config.cmd or ()) if config is not None else []
    if entrypoint[:2] == ["/bin/sh", "-c"] and len(entrypoint) == 3:
        run_args = []
    return [*entrypoint, *run_args]


def execution_log_uri(project: str, location: str, job_id: str, execution: str) -> str:
    """The console link Cloud Run gives as an execution's logUri; its advancedFilter, given to entries.list, returns
    the execution's container output (every real sample has this shape, the "/" in the label key left unescaped)."""
    query = "\n".join(
        [
            'resource.type="cloud_run_job"',
            f'resource.labels.job_name="{job_id}"',
            f'resource.labels.location="{location}"',
            f'labels."run.googleapis.com/execution_name"="{execution}"',
        ]
    )
    return f"https://console.cloud.google.com/logs/viewer?project={project}&advancedFilter={quote(query, safe='/')}"


def go_duration(seconds: float) -> str:
    """A duration as Cloud Run's condition messages print it (Go's time.Duration, 2 decimals): 38.22s, 1m3.6s."""
    minutes, rest = divmod(max(seconds, 0.0), 60)
    text = f"{rest:.2f}".rstrip("0").rstrip(".") + "s"
    return f"{int(minutes)}m{text}" if minutes else text


def completed_condition(failure: str, reason: Reason | None, seconds: float) -> run_v2.Condition:
    """The ``Completed`` condition of a finished execution. Real executions (gcloud executions describe, 2025-26):
    "Execution completed successfully in 38.22s."; a failed task's message (``attempt_failure``) with reason
    NonZeroExitCode; a timeout's with no reason; a cancel's "Cancelled by user." with reason Cancelled."""
    if not failure:
        return res.condition("Completed", State.CONDITION_SUCCEEDED, f"Execution completed successfully in "
                             f"{go_duration(seconds)}.")  # fmt: skip
    condition = res.condition("Completed", State.CONDITION_FAILED, failure)
    if reason is not None:
        condition.execution_reason = reason
    return condition


def attempt_failure(task_id: str, result: AttemptResult) -> str:
    """Cloud Run's message for a task whose last attempt failed, in its 2026 form: "Task X-task0 failed with exit
    code: 1 and message: The container exited with an error."; a timeout reports exit code 0: "... failed with exit
    code: 0 and message: The configured timeout was reached." (incident reports quoting `gcloud run jobs executions
    describe`; PrefectHQ/prefect PR 14497 quotes the older form without the exit code)."""
    if result.timed_out:
        return f"Task {task_id} failed with exit code: 0 and message: The configured timeout was reached."
    if result.error:
        return f"Task {task_id} failed with exit code: 127 and message: {result.error}"
    return f"Task {task_id} failed with exit code: {result.exit_code} and message: The container exited with an error."


class CloudRunJobs:
    """The jobs of one sandbox project: their state, executions, and the processes that run their tasks."""

    def __init__(self, run: CloudRun) -> None:
        self.run = run
        self.ctx = run.ctx
        self.jobs: dict[str, JobRecord] = {}

    @property
    def state_dir(self) -> Path:
        return self.run.state_dir / "_jobs"

    # Routing ----------------------------------------------------------------------------------------------
    def routes(self) -> list[BaseRoute]:
        base = "/v2/projects/{project}/locations/{location}/jobs"
        execution = f"{base}/{{job}}/executions/{{execution}}"
        return [
            Route(base, self.list_jobs, methods=["GET"]),
            Route(base, self.create_job, methods=["POST"]),
            Route(f"{base}/{{job}}", self.job_get_or_iam, methods=["GET"]),
            Route(f"{base}/{{job}}", self.job_post, methods=["POST"]),
            Route(f"{base}/{{job}}", self.update_job, methods=["PATCH"]),
            Route(f"{base}/{{job}}", self.delete_job, methods=["DELETE"]),
            Route(f"{base}/{{job}}/executions", self.list_executions, methods=["GET"]),
            Route(execution, self.get_execution, methods=["GET"]),
            Route(execution, self.execution_post, methods=["POST"]),
            Route(execution, self.delete_execution, methods=["DELETE"]),
            Route(f"{execution}/tasks", self.list_tasks, methods=["GET"]),
            Route(f"{execution}/tasks/{{task}}", self.get_task, methods=["GET"]),
        ]

    def admin_routes(self) -> list[BaseRoute]:
        return [Route("/executions/{execution}/logs", self.admin_execution_logs, methods=["GET"])]

    def _job(self, request: Request, job_id: str | None = None) -> JobRecord:
        parent = self.run._location(request)
        job_id = job_id or request.path_params["job"].partition(":")[0]
        record = self.jobs.get(f"{parent}/jobs/{job_id}")
        if record is None:
            raise not_found(
                f"Resource '{job_id}' of kind 'JOB' in region '{request.path_params['location']}' in project "
                f"'{request.path_params['project']}' does not exist."
            )
        return record

    def _execution(self, request: Request) -> tuple[JobRecord, ExecutionRecord]:
        record = self._job(request)
        short = request.path_params["execution"].partition(":")[0]
        found = record.executions.get(f"{record.job.name}/executions/{short}")
        if found is None:
            raise not_found(
                f"Resource '{short}' of kind 'EXECUTION' in region '{request.path_params['location']}' in project "
                f"'{request.path_params['project']}' does not exist."
            )
        return record, found

    # Jobs -------------------------------------------------------------------------------------------------
    async def list_jobs(self, request: Request) -> JSONResponse:
        parent = self.run._location(request)
        found = [res.to_dict(r.job) for name, r in self.jobs.items() if name.startswith(parent + "/")]
        return JSONResponse({"jobs": found} if found else {})

    async def create_job(self, request: Request) -> JSONResponse:
        parent = self.run._location(request)
        job_id = request.query_params.get("jobId", "")
        check_job_id(job_id)
        name = f"{parent}/jobs/{job_id}"
        if name in self.jobs:
            raise already_exists(f"Resource '{job_id}' already exists.")
        spec = await self._parse(request)
        if spec.name and spec.name != name:
            raise invalid_argument("job.name: must be empty when creating a job")
        self._validate(spec)
        if request.query_params.get("validateOnly") == "true":
            return self.run._operation_json(self.run._new_operation(parent, done_with=spec))
        job = run_v2.Job(name=name, uid=str(uuid.uuid4()), generation=1, create_time=res.now())
        job.creator = "sandbox-user@example.com"
        job.execution_count = 0
        run_v2.Job.pb(job).latest_created_execution.SetInParent()  # present and empty until the first run
        record = JobRecord(job_id, job)
        self._store(record, spec)
        self.jobs[name] = record
        return self.run._operation_json(self.run._new_operation(parent, done_with=record.job))

    async def update_job(self, request: Request) -> JSONResponse:
        parent = self.run._location(request)
        job_id = request.path_params["job"]
        record = self.jobs.get(f"{parent}/jobs/{job_id}")
        if record is None:
            if request.query_params.get("allowMissing") != "true":
                raise not_found(f"Resource '{job_id}' of kind 'JOB' does not exist.")
            request.scope["query_string"] = f"jobId={job_id}".encode()
            return await self.create_job(request)
        spec = await self._parse(request)
        if spec.etag and spec.etag != record.job.etag:
            raise GoogleApiError(409, f"Etag mismatch for job '{job_id}'; read it again.", "ABORTED")
        self._validate(spec)
        if request.query_params.get("validateOnly") == "true":
            return self.run._operation_json(self.run._new_operation(parent, done_with=spec))
        record.job.generation += 1
        self._store(record, spec)
        return self.run._operation_json(self.run._new_operation(parent, done_with=record.job))

    def _store(self, record: JobRecord, spec: run_v2.Job) -> None:
        job = record.job
        for name in JOB_FIELDS:
            setattr(job, name, getattr(spec, name))
        job.template = with_job_defaults(spec.template)
        job.template.template.service_account = service_account_of(self.ctx, job.template.template)
        if not job.launch_stage:
            job.launch_stage = "GA"
        job.update_time = res.now()
        job.last_modifier = "sandbox-user@example.com"
        job.observed_generation = job.generation
        job.reconciling = False
        # A job is ready to run once stored: the create operation returns it with Ready (prefect-gcp polls for it).
        job.terminal_condition = res.condition("Ready", State.CONDITION_SUCCEEDED)
        job.etag = res.etag_of(job)

    async def _parse(self, request: Request) -> run_v2.Job:
        try:
            return run_v2.Job.from_json(await request.body() or b"{}")
        except (json_format.ParseError, ValueError) as exc:
            raise invalid_argument(f"Invalid JSON payload received. {exc}") from None

    def _validate(self, spec: run_v2.Job) -> None:
        task = spec.template.template
        if not task.containers:
            raise invalid_argument("job.template.template.containers: at least one container is required")
        for index, container in enumerate(task.containers):
            prefix = f"job.template.template.containers[{index}]"
            if not container.image:
                raise invalid_argument(f"{prefix}.image: required")
            if resolve_image(self.ctx, container.image) is None:
                raise invalid_argument(
                    f"{prefix}.image: Image '{container.image}' not found. Make sure the image exists and that the "
                    "service agent can pull it."
                )
        # Container sizes as for a service's (validation.py); jobs run in the second generation environment.
        check_container_sizes(task.containers, "job.template.template.containers", task.node_selector.accelerator, True)
        if spec.template.task_count < 0 or spec.template.parallelism < 0:
            raise invalid_argument("job.template: taskCount and parallelism cannot be negative")
        if has_field(task, "timeout") and not 0 < task.timeout.total_seconds() <= 168 * 3600:
            raise invalid_argument("job.template.template.timeout: must be between 1 second and 168 hours")
        check_account_visible(self.ctx, task.service_account)  # as for a revision

    async def job_get_or_iam(self, request: Request) -> Response:
        job_id, _, verb = request.path_params["job"].partition(":")
        record = self._job(request, job_id)
        if verb == "getIamPolicy":
            return JSONResponse(record.policy)
        if verb:
            raise not_found(f"Method '{verb}' not found.")
        return JSONResponse(res.to_dict(record.job))

    async def job_post(self, request: Request) -> Response:
        job_id, _, verb = request.path_params["job"].partition(":")
        record = self._job(request, job_id)
        if verb == "run":
            return await self._run(request, record)
        return await post_policy_method(self.ctx, request, verb, record, record.job.name)

    async def delete_job(self, request: Request) -> JSONResponse:
        parent = self.run._location(request)
        record = self._job(request)
        etag = request.query_params.get("etag")
        if etag and etag != record.job.etag:
            raise GoogleApiError(409, f"Etag mismatch for job '{record.job_id}'; read it again.", "ABORTED")
        if request.query_params.get("validateOnly") == "true":
            return self.run._operation_json(self.run._new_operation(parent, done_with=record.job))
        del self.jobs[record.job.name]
        # The job's executions go with it; one still running is stopped first, as Cloud Run stops its containers.
        await asyncio.gather(*(self._stop(ex) for ex in record.executions.values()))
        record.job.delete_time = res.now()
        return self.run._operation_json(self.run._new_operation(parent, done_with=record.job))

    # Running ----------------------------------------------------------------------------------------------
    async def _run(self, request: Request, record: JobRecord) -> JSONResponse:
        parent = self.run._location(request)
        raw = await request.body()
        try:
            run = run_v2.RunJobRequest.from_json(raw or b"{}", ignore_unknown_fields=False)
        except (json_format.ParseError, ValueError) as exc:
            raise invalid_argument(f"Invalid JSON payload received. {exc}") from None
        if run.etag and run.etag != record.job.etag:
            raise GoogleApiError(409, f"Etag mismatch for job '{record.job_id}'; read it again.", "ABORTED")
        template = self._apply_overrides(record.job.template, run.overrides)
        if run.validate_only:
            return self.run._operation_json(self.run._new_operation(parent, done_with=record.job))
        execution = self._new_execution(record, template, self.run._new_operation(parent))
        execution.operation.metadata.Pack(run_v2.Execution.pb(execution.execution))
        record.executions[execution.execution.name] = execution
        job = record.job
        job.execution_count += 1
        job.latest_created_execution = run_v2.ExecutionReference(
            name=execution.execution.name,
            create_time=execution.execution.create_time,
            completion_status=run_v2.ExecutionReference.CompletionStatus.EXECUTION_RUNNING,
        )
        job.etag = res.etag_of(job)
        execution.runner = asyncio.create_task(self._execute(record, execution))
        return self.run._operation_json(execution.operation)

    @staticmethod
    def _apply_overrides(template: run_v2.ExecutionTemplate, overrides: run_v2.RunJobRequest.Overrides):
        template = run_v2.ExecutionTemplate(template)
        if overrides.task_count:
            template.task_count = overrides.task_count
        if has_field(overrides, "timeout"):
            template.template.timeout = overrides.timeout
        for override in overrides.container_overrides:
            matches = [c for c in template.template.containers if c.name == override.name] or (
                list(template.template.containers[:1]) if not override.name else []
            )
            if not matches:
                raise invalid_argument(f"overrides.containerOverrides: no container named '{override.name}'")
            container = matches[0]
            if override.args or override.clear_args:
                container.args = list(override.args)
            if override.env:
                names = {e.name for e in override.env}
                container.env = [e for e in container.env if e.name not in names] + list(override.env)
        return template

    def _new_execution(
        self, record: JobRecord, template: run_v2.ExecutionTemplate, operation: operations_pb2.Operation
    ) -> ExecutionRecord:
        short = f"{record.job_id}-{''.join(secrets.choice(EXECUTION_SUFFIX) for _ in range(5))}"
        name = f"{record.job.name}/executions/{short}"
        count = template.task_count or DEFAULT_TASK_COUNT
        execution = run_v2.Execution(
            name=name,
            uid=str(uuid.uuid4()),
            creator="sandbox-user@example.com",
            generation=1,
            labels={**record.job.labels, **template.labels, "run.googleapis.com/jobUid": record.job.uid},
            create_time=res.now(),
            launch_stage=record.job.launch_stage,
            job=record.job_id,
            parallelism=min(template.parallelism or count, count),  # 0: as many as possible
            task_count=count,
            template=template.template,
            reconciling=True,
            observed_generation=1,
            log_uri=execution_log_uri(self.ctx.config.project, record.job.name.split("/")[3], record.job_id, short),
        )
        # Right after jobs.run only Completed is there, pending, while the execution reconciles.
        execution.conditions = [res.condition("Completed", State.CONDITION_PENDING)]
        execution.etag = res.etag_of(execution)
        tasks = [
            TaskRecord(
                run_v2.Task(
                    name=f"{name}/tasks/{short}-task{index}",
                    uid=str(uuid.uuid4()),
                    job=record.job_id,
                    execution=short,
                    index=index,
                    create_time=res.now(),
                    containers=list(template.template.containers),
                    max_retries=template.template.max_retries,
                    timeout=template.template.timeout,
                    service_account=template.template.service_account,
                    log_uri=execution.log_uri,
                )
            )
            for index in range(count)
        ]
        folder = self.state_dir / record.job_id / short
        return ExecutionRecord(execution, operation, folder, tasks)

    async def _execute(self, record: JobRecord, ex: ExecutionRecord) -> None:
        execution = ex.execution
        failure, reason = "", None
        try:
            # Provisioning: the execution stays pending (only Completed, pending) until its first task starts.
            delay = self.ctx.config.job_start_seconds * self.ctx.config.time_scale
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ex.stop_requested.wait(), timeout=delay)
            if ex.stopping:
                execution.cancelled_count = execution.task_count  # no task ever started
                self._finish(record, ex, "Cancelled by user.", Reason.CANCELLED)
                return
            try:  # the image "pulled": its Python environment made, the first time a job runs it (image_env.py)
                ex.environment = await image_environment(self.ctx, execution.template, ex.stop_requested)
            except ImageEnvironmentError as exc:
                self._finish(record, ex, exc.message, Reason.NON_ZERO_EXIT_CODE)
                return
            if ex.stopping:
                execution.cancelled_count = execution.task_count
                self._finish(record, ex, "Cancelled by user.", Reason.CANCELLED)
                return
            account = execution.template.service_account
            ex.metadata = await serve_app(
                RequireFlavor(build_metadata_app(self.ctx.config, self.ctx.identity, account=account)),
                f"metadata:{execution.name.rsplit('/', 1)[1]}",
            )
            execution.conditions = [
                res.condition("Completed", State.CONDITION_PENDING, "Waiting for execution to complete."),
                res.condition("ResourcesAvailable", State.CONDITION_SUCCEEDED, "Provisioned imported containers."),
                res.condition("Started", State.CONDITION_SUCCEEDED,
                              f"Started deployed execution in {go_duration(self.ctx.config.job_start_seconds)}."),
            ]  # fmt: skip
            execution.start_time = res.now()
            slots = asyncio.Semaphore(execution.parallelism)
            outcomes = await asyncio.gather(*(self._run_task(record, ex, task, slots) for task in ex.tasks))
            failure, reason = next(((f, r) for f, r in outcomes if f), ("", None))
        finally:
            if ex.metadata is not None:
                await ex.metadata.stop()
        if ex.stopping:
            failure, reason = "Cancelled by user.", Reason.CANCELLED
        self._finish(record, ex, failure, reason)

    async def _run_task(
        self, record: JobRecord, ex: ExecutionRecord, task: TaskRecord, slots: asyncio.Semaphore
    ) -> tuple[str, Reason | None]:
        """Run one task to success or its last retry: its failure message ("" when it succeeded or was stopped) and
        the execution reason (none for a timeout, as real timed-out executions show)."""
        execution = ex.execution
        async with slots:
            result = AttemptResult(None, stopped=True)
            for attempt in range(task.task.max_retries + 1):
                if ex.stopping:
                    break
                if attempt:
                    # "The number of tasks which have retried at least once" (run.v2 Execution.retriedCount).
                    execution.retried_count += attempt == 1
                    task.task.retried = attempt
                try:
                    spec = self._attempt_spec(record, ex, task.task, attempt)
                    self._claim_capacity(task)
                except RevisionStartError as exc:  # e.g. a secret the job's account cannot read: no retry helps
                    execution.failed_count += 1
                    return exc.message, Reason.NON_ZERO_EXIT_CODE
                task.attempt = TaskAttempt(spec)
                task.task.start_time = res.now()
                execution.running_count += 1
                execution.etag = res.etag_of(execution)
                try:
                    result = await task.attempt.run()
                finally:
                    execution.running_count -= 1
                    task.holding = False
                task.task.last_attempt_result = run_v2.TaskAttemptResult(exit_code=result.exit_code or 0)
                if result.succeeded or ex.stopping:
                    break
            task.task.completion_time = res.now()
            if ex.stopping and not result.succeeded:
                execution.cancelled_count += 1
                return "", None
            if result.succeeded:
                execution.succeeded_count += 1
                return "", None
            execution.failed_count += 1
            reason = None if result.timed_out else Reason.NON_ZERO_EXIT_CODE
            return attempt_failure(task.task.name.rsplit("/", 1)[1], result), reason

    def _claim_capacity(self, task: TaskRecord) -> None:
        """A task starts only while the region's quotas hold its container beside what runs (capacity.py); it
        holds its vCPU and memory until the attempt ends."""
        want = footprint_of(task.task.containers)
        refusal = exceeded(self.ctx.config, self.run.held(), self.run.releases.pending(), want)
        if refusal is not None:
            raise RevisionStartError(refusal, run_v2.Condition.CommonReason.REVISION_FAILED)
        task.holding = True

    def running_footprints(self) -> list[Footprint]:
        """What the running tasks of every execution hold of the region's quotas."""
        return [
            footprint_of(t.task.containers)
            for record in self.jobs.values()
            for ex in record.executions.values()
            for t in ex.tasks
            if t.holding
        ]

    def _attempt_spec(self, record: JobRecord, ex: ExecutionRecord, task: run_v2.Task, attempt: int) -> AttemptSpec:
        container = task.containers[0]
        builds = self.ctx.module("cloudbuild")
        config = builds.image_config(container.image) if builds is not None else None
        argv = container_argv(config, list(container.command), list(container.args))
        if not argv:
            raise RevisionStartError(
                f"Image '{container.image}' has no command the sandbox can run: give the job's container a command.",
                run_v2.Condition.CommonReason.CONTAINER_MISSING,
            )
        image_env = {k: v for k, v in (config.env if config else {}).items() if k not in HOST_ONLY_ENV}
        folder = ex.folder / f"task{task.index}"
        assert ex.metadata is not None
        metadata = ex.metadata.url.removeprefix("http://")
        env = {
            **image_env,
            **container_env(self.ctx, container, task.service_account),
            # The container runtime contract for jobs.
            "CLOUD_RUN_JOB": record.job_id,
            "CLOUD_RUN_EXECUTION": ex.execution.name.rsplit("/", 1)[1],
            "CLOUD_RUN_TASK_INDEX": str(task.index),
            "CLOUD_RUN_TASK_ATTEMPT": str(attempt),
            "CLOUD_RUN_TASK_COUNT": str(ex.execution.task_count),
            "HOME": str(folder / "home"),
            # The platform's plumbing: the metadata server (as the job's identity), storage, the Hub as "the
            # internet", and the trust store a Google-named endpoint needs (the TLS face's CA, when it is on).
            "GCE_METADATA_HOST": metadata,
            "GCE_METADATA_IP": metadata,
            "STORAGE_EMULATOR_HOST": self.run.gcs_url,
            "HF_ENDPOINT": self.ctx.hub_url,
            **self._trust_store(),
        }
        (folder / "home").mkdir(parents=True, exist_ok=True)
        # The image's WORKDIR: in its environment's copy of the image's files, else a folder of the task's own.
        root = ex.environment.root if ex.environment else folder / "root"
        workdir = root / (config.workdir if config else "/").lstrip("/")
        return AttemptSpec(
            argv=argv,
            env=env,
            workdir=workdir,
            timeout_s=timeout_seconds(task),
            image_bin=ex.environment.bin if ex.environment else None,
            stdout=folder / f"attempt{attempt}.stdout",
            stderr=folder / f"attempt{attempt}.stderr",
        )

    def _trust_store(self) -> dict[str, str]:
        ca = self.ctx.tls_ca_file
        if not ca:
            return {}
        return {"SSL_CERT_FILE": ca, "REQUESTS_CA_BUNDLE": ca, "HTTPLIB2_CA_CERTS": ca, "CURL_CA_BUNDLE": ca}

    def _finish(self, record: JobRecord, ex: ExecutionRecord, failure: str, reason: Reason | None) -> None:
        execution = ex.execution
        execution.completion_time = res.now()
        execution.reconciling = False
        if not has_field(execution, "start_time"):
            _set_condition(execution, res.condition("ResourcesAvailable", State.CONDITION_FAILED, failure))
        started = execution.start_time if has_field(execution, "start_time") else execution.create_time
        seconds = (execution.completion_time - started).total_seconds()
        _set_condition(execution, completed_condition(failure, reason, seconds))
        execution.etag = res.etag_of(execution)
        status = run_v2.ExecutionReference.CompletionStatus
        if record.job.latest_created_execution.name == execution.name:
            reference = record.job.latest_created_execution
            reference.completion_time = execution.completion_time
            reference.completion_status = (
                status.EXECUTION_CANCELLED
                if reason == Reason.CANCELLED
                else status.EXECUTION_FAILED
                if failure
                else status.EXECUTION_SUCCEEDED
            )
            record.job.etag = res.etag_of(record.job)
        if failure and reason != Reason.CANCELLED:
            # A failed execution fails its jobs.run operation: ``error`` (google.rpc.Status), no ``response``, as
            # operation.result() callers see it (apache/airflow's CloudRunExecuteJobOperator fails on it; its
            # deferrable trigger reads only operation.error, and a cancel is the case that "completes the LRO
            # without populating operation.error": airflow PR 67050, issue 57791). Code 13 INTERNAL with the
            # failed task's message (issue 35's source audit; the code is not in Google's public docs).
            self.run._finish(ex.operation, error=GoogleApiError(500, failure, "INTERNAL"))
            return
        self.run._finish(ex.operation, execution)

    async def _stop(self, ex: ExecutionRecord) -> None:
        """Stop a running execution (cancelled or deleted): its pending start, and its tasks' processes."""
        if not ex.running:
            return
        ex.stop_requested.set()
        await asyncio.gather(*(t.attempt.stop() for t in ex.tasks if t.attempt is not None))
        if ex.runner is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(asyncio.shield(ex.runner), timeout=30)

    # Executions -------------------------------------------------------------------------------------------
    async def list_executions(self, request: Request) -> JSONResponse:
        record = self._job(request)
        found = [res.to_dict(e.execution) for e in reversed(record.executions.values())]
        return JSONResponse({"executions": found} if found else {})

    async def get_execution(self, request: Request) -> JSONResponse:
        return JSONResponse(res.to_dict(self._execution(request)[1].execution))

    async def execution_post(self, request: Request) -> JSONResponse:
        verb = request.path_params["execution"].partition(":")[2]
        if verb != "cancel":
            raise not_found(f"Method '{verb or 'POST'}' not found.")
        _, ex = self._execution(request)
        parent = self.run._location(request)
        if not ex.running:
            raise GoogleApiError(
                400, f"Execution '{ex.execution.name.rsplit('/', 1)[1]}' is not running.", "FAILED_PRECONDITION"
            )
        await self._stop(ex)
        return self.run._operation_json(self.run._new_operation(parent, done_with=ex.execution))

    async def delete_execution(self, request: Request) -> JSONResponse:
        record, ex = self._execution(request)
        parent = self.run._location(request)
        if request.query_params.get("validateOnly") == "true":
            return self.run._operation_json(self.run._new_operation(parent, done_with=ex.execution))
        await self._stop(ex)
        del record.executions[ex.execution.name]
        ex.execution.delete_time = res.now()
        return self.run._operation_json(self.run._new_operation(parent, done_with=ex.execution))

    async def list_tasks(self, request: Request) -> JSONResponse:
        _, ex = self._execution(request)
        found = [res.to_dict(t.task) for t in ex.tasks]
        return JSONResponse({"tasks": found} if found else {})

    async def get_task(self, request: Request) -> JSONResponse:
        _, ex = self._execution(request)
        wanted = request.path_params["task"]
        for task in ex.tasks:
            if task.task.name.rsplit("/", 1)[1] == wanted:
                return JSONResponse(res.to_dict(task.task))
        raise not_found(f"Resource '{wanted}' of kind 'TASK' does not exist.")

    # Admin ------------------------------------------------------------------------------------------------
    async def admin_execution_logs(self, request: Request) -> Response:
        """An execution's container output, every task and attempt in order (what its logUri shows)."""
        short = request.path_params["execution"]
        folders = sorted(self.state_dir.glob(f"*/{short}"))
        if not folders:
            return PlainTextResponse(f"no logs for execution {short}", status_code=404)
        parts = []
        for path in sorted(folders[0].glob("task*/attempt*.*"), key=lambda p: (p.parent.name, p.stat().st_mtime)):
            text = path.read_text(errors="replace")
            if text:
                parts.append(f"==> {path.parent.name} {path.name} <==\n{text}")
        return PlainTextResponse("\n".join(parts))

    async def shutdown(self) -> None:
        await asyncio.gather(
            *(self._stop(ex) for record in self.jobs.values() for ex in record.executions.values()),
            return_exceptions=True,
        )


def _set_condition(execution: run_v2.Execution, condition: run_v2.Condition) -> None:
    """Replace the condition of the same type, keeping their order."""
    execution.conditions = [condition if c.type_ == condition.type_ else c for c in execution.conditions]
