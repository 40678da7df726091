"""Running one build: QUEUED, WORKING through FETCHSOURCE, the steps and PUSH, then a final status.

Every phase takes simulated seconds on the sandbox clock and counts against ``build.timeout`` (from
``start_time``, as Cloud Build counts it) and the step's own ``timeout``. The log is kept line by line as
Cloud Build writes it ("starting build", "FETCHSOURCE", "Step #0: ...", "DONE" / "ERROR"); the API module
writes it to the logs bucket once the build is final, before its operation is marked done.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
from collections.abc import Callable

from google.cloud.devtools import cloudbuild_v1 as cb

from sandbox.control.artifactregistry.images import parse_reference
from sandbox.control.cloudbuild.docker import (
    MACHINES,
    BuildRequest,
    StepOutcome,
    buildkit_enabled,
    is_docker_builder,
    normalize_reference,
    oom_killed_output,
    parse_build,
    parse_command,
    repository_of,
    simulate_build,
)
from sandbox.control.cloudbuild.image_config import ImageConfig
from sandbox.control.cloudbuild.state import BuildRecord, BuildSettings, Status
from sandbox.control.cloudbuild.storage import BuildStorage
from sandbox.control.cloudbuild.workspace import Workspace, normalize
from sandbox.control.errors import GoogleApiError

FailureType = cb.Build.FailureInfo.FailureType
PHASE_SECONDS = 1.0  # fetching the source, a step that is not a docker build, pushing one image


class _TimedOut(Exception):
    """The build's (or a step's) timeout ran out."""


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def step_label(index: int, step: cb.BuildStep) -> str:
    return f'Step #{index} - "{step.id}"' if step.id else f"Step #{index}"


class BuildRunner:
    """Drives one BuildRecord to a final status. ``on_change`` is called whenever the build visibly changes."""

    def __init__(
        self,
        record: BuildRecord,
        settings: BuildSettings,
        time_scale: float,
        storage: BuildStorage,
        registry,
        project: str,
        on_change: Callable[[], None],
        allowed: Callable[[str, str], bool] = lambda _permission, _resource: True,
        image_configs: dict[str, ImageConfig] | None = None,
        image_home: str = "",
    ) -> None:
        self.record = record
        # What each built digest runs (ENTRYPOINT, CMD, ENV), kept by the module for Cloud Run to start it.
        self.image_configs = image_configs if image_configs is not None else {}
        self.image_home = image_home  # where the Python environments of the images built here live (image_env.py)
        # Whether the build's identity holds a permission on a resource (sandbox.authz, asked by the API module).
        self.allowed = allowed
        self.build = record.build
        # Copied at the start: a settings change affects the next builds, not one that runs.
        self.settings = settings.model_copy()
        self.scale = time_scale
        self.storage = storage
        self.registry = registry
        self.project = project
        self.on_change = on_change
        self.workspace = Workspace()
        self.local_images: dict[str, str] = {}  # the builder's docker images: normalized ref -> digest
        self.elapsed = 0.0
        timeout = self.build.timeout.total_seconds()
        self.timeout_s = timeout if timeout > 0 else 3600.0

    @property
    def identity(self) -> str:
        """The email of the service account the build runs as."""
        return self.build.service_account.rsplit("/", 1)[-1]

    # Log and clock -------------------------------------------------------------------------------------------
    def log(self, line: str = "") -> None:
        self.record.log.append(line)

    async def _spend(self, seconds: float, step_limit: float | None = None) -> None:
        """Let ``seconds`` of simulated time pass; raise _TimedOut when a timeout ends it first."""
        allowed = self.timeout_s - self.elapsed
        if step_limit is not None:
            allowed = min(allowed, step_limit)
        if seconds > allowed:
            await asyncio.sleep(max(allowed, 0.0) * self.scale)
            self.elapsed += max(allowed, 0.0)
            raise _TimedOut
        await asyncio.sleep(seconds * self.scale)
        self.elapsed += seconds

    def _finish(
        self, status: Status, detail: str = "", failure: FailureType | None = None, failure_detail: str = ""
    ) -> None:
        build = self.build
        build.status = status
        build.finish_time = now()
        if detail:
            build.status_detail = detail
        if failure is not None:
            build.failure_info = cb.Build.FailureInfo(type_=failure, detail=failure_detail or detail)
        self.on_change()

    # The build ------------------------------------------------------------------------------------------------
    async def run(self) -> None:
        build = self.build
        await asyncio.sleep(self.settings.queue_seconds * self.scale)  # QUEUED: not counted in the timeout
        build.status = Status.WORKING
        build.start_time = now()
        for step in build.steps:
            step.status = Status.QUEUED
        self.on_change()
        self.log(f'starting build "{build.id}"')
        self.log()
        try:
            if "storage_source" in build.source and not await self._fetch_source():
                return
            self.log("BUILD")
            started = now()
            finished_steps = await self._steps()
            build.timing["BUILD"] = cb.TimeSpan(start_time=started, end_time=now())
            if not finished_steps:
                return
            if build.images and not await self._push_images():
                return
            self.log("DONE")
            self._finish(Status.SUCCESS)
        except _TimedOut:
            for step in build.steps:
                if step.status == Status.WORKING:
                    step.status = Status.TIMEOUT
                    step.timing.end_time = now()
            self.log("TIMEOUT")
            self.log("ERROR: context deadline exceeded")
            self._finish(Status.TIMEOUT, f"Build timed out after {self.timeout_s:g}s (its timeout).")

    async def _fetch_source(self) -> bool:
        build = self.build
        source = build.source.storage_source
        generation = build.source_provenance.resolved_storage_source.generation or source.generation
        url = f"gs://{source.bucket}/{source.object_}#{generation}"
        started = now()
        self.log("FETCHSOURCE")
        if not self.allowed("storage.objects.get", f"projects/_/buckets/{source.bucket}"):
            # The build's identity reads the source: on new projects (Compute default account, no Editor grant)
            # this is a first-run failure. Cloud Build's log line, as in GoogleCloudPlatform/
            # bigquery-dlp-remote-function issue 70 ("AccessDeniedException: 403 ...-compute@developer.
            # gserviceaccount.com does not have storage.objects.list access ..."); fetching one object needs get.
            self.log(
                f"AccessDeniedException: 403 {self.identity} does not have storage.objects.get access to the Google "
                "Cloud Storage object. Permission 'storage.objects.get' denied on resource (or it may not exist)."
            )
            self.log(f"Fetching storage object: {url}")
            await self._spend(PHASE_SECONDS)
            return self._source_failed(
                f"failed to fetch {url}: {self.identity} does not have storage.objects.get access"
            )
        self.log(f"Fetching storage object: {url}")
        data = await self.storage.download(source.bucket, source.object_, generation)
        await self._spend(PHASE_SECONDS)
        if data is None:
            return self._source_failed(f"storage: object doesn't exist: {url}")
        self.log(f"Copying {url}...")
        self.log(f"/ [1 files][{len(data)} B/{len(data)} B]")
        self.log(f"Operation completed over 1 objects/{len(data)} B.")
        try:
            self.workspace = await asyncio.to_thread(Workspace.from_archive, data)
        except ValueError as exc:
            self.log("gzip: stdin: not in gzip format")
            return self._source_failed(f"failed to unpack the source archive {url}: {exc}")
        build.timing["FETCHSOURCE"] = cb.TimeSpan(start_time=started, end_time=now())
        return True

    def _source_failed(self, detail: str) -> bool:
        self.log("ERROR")
        self.log(f"ERROR: {detail}")
        self._finish(Status.FAILURE, f"Failed to fetch source: {detail}", FailureType.FETCH_SOURCE_FAILED)
        return False

    # Steps ----------------------------------------------------------------------------------------------------
    def _env(self, step: cb.BuildStep) -> dict[str, str]:
        env: dict[str, str] = {}
        for item in [*self.build.options.env, *step.env]:  # a step's own env wins
            key, _, value = item.partition("=")
            env[key] = value
        return env

    async def _steps(self) -> bool:
        """Run the steps in order; False when the build ended (its final status is set)."""
        forced = self.record.forced
        for index, step in enumerate(self.build.steps):
            label = step_label(index, step)
            self.log(f"Starting {label}")
            step.status = Status.WORKING
            step.timing = cb.TimeSpan(start_time=now())
            self.on_change()
            outcome = self._execute(index, step)
            if forced in ("FAILURE", "INTERNAL_ERROR", "TIMEOUT") and index == 0:
                outcome = StepOutcome(forced, 1 if forced == "FAILURE" else 0, [], self.settings.build_seconds / 2)
            elif forced == "OOM_KILLED" and index == 0:
                lines = [*outcome.lines[:1], *oom_killed_output()]  # the greeting, then the killed compile
                outcome = StepOutcome("FAILURE", 1, lines, self.settings.build_seconds / 2)
            elif forced == "SUCCESS" and outcome.status != "SUCCESS":
                outcome = self._forced_success(index, step)
            limit = step.timeout.total_seconds() if "timeout" in step else None
            if outcome.status == "TIMEOUT":
                await self._spend(outcome.seconds)
                raise _TimedOut
            try:
                await self._spend(outcome.seconds, limit or None)
            except _TimedOut:
                self._log_step(label, outcome.lines[: len(outcome.lines) // 2])
                raise
            self._log_step(label, outcome.lines)
            step.timing.end_time = now()
            if outcome.status == "INTERNAL_ERROR":
                # The worker died with the compiler (OOM): no "Finished Step", no ERROR line; the log just stops.
                step.status = Status.INTERNAL_ERROR
                self._finish(
                    Status.INTERNAL_ERROR,
                    "An internal error occurred: the build worker stopped responding while running "
                    f'build step {index} "{step.name}".',
                )
                return False
            self.log(f"Finished {label}")
            if outcome.status == "SUCCESS":
                step.status = Status.SUCCESS
                self.local_images.update(outcome.images)
                if outcome.config is not None:
                    self.image_configs.update(dict.fromkeys(outcome.images.values(), outcome.config))
                continue
            step.status = Status.FAILURE
            step.exit_code = outcome.exit_code
            if step.allow_failure or outcome.exit_code in step.allow_exit_codes:
                continue
            detail = (
                f'Build step failure: build step {index} "{step.name}" failed: step exited with non-zero status: '
                f"{outcome.exit_code}"
            )
            self.log("ERROR")
            self.log(f"ERROR: {detail.removeprefix('Build step failure: ')}")
            self._finish(Status.FAILURE, detail, FailureType.USER_BUILD_STEP)
            return False
        return True

    def _log_step(self, label: str, lines: list[str]) -> None:
        for line in lines:
            self.log(f"{label}: {line}")

    def _execute(self, index: int, step: cb.BuildStep) -> StepOutcome:
        """What the step does. Only the docker CLI is interpreted; any other builder succeeds as a no-op."""
        greeting = [f"Already have image (with digest): {step.name}"]
        if not is_docker_builder(step.name, step.entrypoint) or step.script:
            return StepOutcome("SUCCESS", 0, [f"Pulling image: {step.name}"], PHASE_SECONDS)
        env = self._env(step)
        command = parse_command(list(step.args))
        if command.subcommand == "build":
            machine = MACHINES[cb.BuildOptions.MachineType(self.build.options.machine_type).name]
            request = BuildRequest(
                command=parse_build(command.args),
                workspace=self.workspace,
                step_dir=normalize(step.dir_),
                env=env,
                buildkit=command.buildx or buildkit_enabled(env),
                machine=machine,
                memory_per_job_gb=self.settings.memory_per_job_gb,
                build_seconds=self.settings.build_seconds,
                image_home=self.image_home,
            )
            outcome = simulate_build(request)
        elif command.subcommand == "push":
            outcome = self._docker_push([a for a in command.args if not a.startswith("-")])
        elif command.subcommand == "tag":
            outcome = self._docker_tag(command.args)
        else:
            outcome = StepOutcome("SUCCESS", 0, [], PHASE_SECONDS)  # pull, run, images, login, ...
        outcome.lines = greeting + outcome.lines
        return outcome

    def _forced_success(self, index: int, step: cb.BuildStep) -> StepOutcome:
        """A step the admin API forced to succeed: its ``-t`` images exist with a digest derived from the build."""
        images: dict[str, str] = {}
        if is_docker_builder(step.name, step.entrypoint):
            command = parse_command(list(step.args))
            if command.subcommand == "build":
                digest = "sha256:" + hashlib.sha256(f"{self.build.id}/{index}".encode()).hexdigest()
                images = {normalize_reference(t): digest for t in parse_build(command.args).tags}
        return StepOutcome(
            "SUCCESS", 0, [f"Already have image (with digest): {step.name}"], self.settings.build_seconds, images
        )

    def _docker_tag(self, args: list[str]) -> StepOutcome:
        refs = [a for a in args if not a.startswith("-")]
        if len(refs) != 2:
            return StepOutcome("FAILURE", 1, ['"docker tag" requires exactly 2 arguments.'], PHASE_SECONDS)
        digest = self.local_images.get(normalize_reference(refs[0]))
        if digest is None:
            return StepOutcome("FAILURE", 1, [f"Error response from daemon: No such image: {refs[0]}"], PHASE_SECONDS)
        return StepOutcome("SUCCESS", 0, [], PHASE_SECONDS, {normalize_reference(refs[1]): digest})

    def _docker_push(self, refs: list[str]) -> StepOutcome:
        if len(refs) != 1:
            return StepOutcome("FAILURE", 1, ['"docker push" requires exactly 1 argument.'], PHASE_SECONDS)
        ok, lines, _ = self._push(refs[0])
        return StepOutcome("SUCCESS" if ok else "FAILURE", 0 if ok else 1, lines, 2 * PHASE_SECONDS)

    # Pushing --------------------------------------------------------------------------------------------------
    def _push(self, ref: str) -> tuple[bool, list[str], str | None]:
        """Push a local image to its registry, as ``docker push`` prints it: (ok, lines, digest)."""
        normalized = normalize_reference(ref)
        digest = self.local_images.get(normalized)
        if digest is None:
            return False, [f"An image does not exist locally with the tag: {repository_of(normalized)}"], None
        size = 200_000_000 + int(digest[7:15], 16) % 800_000_000
        layers = [hashlib.sha256(f"{digest}/{i}".encode()).hexdigest()[:12] for i in range(3)]
        lines = [f"The push refers to repository [{repository_of(normalized)}]"]
        lines += [f"{layer}: Preparing" for layer in layers]
        error = self._record_push(normalized, digest, size)
        if error:
            return False, [*lines, error], None
        tag = normalized.rpartition(":")[2] if "@" not in normalized else normalized.partition("@")[2]
        lines += [f"{layer}: Pushed" for layer in layers]
        lines.append(f"{tag}: digest: {digest} size: {1024 + size % 2048}")
        return True, lines, digest

    def _record_push(self, ref: str, digest: str, size: int) -> str | None:
        """Store the image in Artifact Registry; docker's error line when the registry refuses it."""
        parsed = parse_reference(ref)
        if parsed is None:
            host = ref.split("/", 1)[0]
            if host == "gcr.io" or host.endswith(".gcr.io"):
                return (
                    "denied: gcr.io repo does not exist. Creating on push requires the "
                    "artifactregistry.repositories.createOnPush permission"
                )
            return "denied: requested access to the resource is denied"
        repository = f"projects/{parsed.project}/locations/{parsed.location}/repositories/{parsed.repository}"
        if parsed.project != self.project or not self.allowed(
            "artifactregistry.repositories.uploadArtifacts", repository
        ):
            # docker push's line when the pushing identity may not upload (GoogleCloudPlatform/cymbal-superstore
            # PR 4); the same text whether the repository is in another project, missing, or the grant is.
            return (
                'denied: Permission "artifactregistry.repositories.uploadArtifacts" denied on resource '
                f'"projects/{parsed.project}/locations/{parsed.location}/repositories/{parsed.repository}" '
                "(or it may not exist)"
            )
        if self.registry is None:
            return None  # a sandbox without Artifact Registry: nothing to record
        try:
            self.registry.record_image(
                parsed.location,
                parsed.repository,
                parsed.image,
                digest,
                tags=[parsed.tag] if parsed.tag else [],
                size=size,
            )
        except GoogleApiError as exc:
            if exc.code == 404:
                return f'name unknown: Repository "{parsed.repository}" not found'
            return f"denied: {exc.message}"
        return None

    async def _push_images(self) -> bool:
        """Push ``build.images`` after the steps; False when the build ended FAILURE."""
        build = self.build
        started = now()
        self.log("PUSH")
        missing = [i for i in build.images if normalize_reference(i) not in self.local_images]
        if missing:
            listed = " ".join(f'"{m}"' for m in missing)
            detail = f"failed to find one or more images after execution of build steps: [{listed}]"
            self.log("ERROR")
            self.log(f"ERROR: {detail}")
            self._finish(Status.FAILURE, detail, FailureType.PUSH_IMAGE_NOT_FOUND)
            return False
        for image in build.images:
            pushed_at = now()
            self.log(f"Pushing {image}")
            ok, lines, digest = self._push(image)
            for line in lines:
                self.log(line)
            await self._spend(PHASE_SECONDS)
            if not ok:
                self.log("ERROR")
                self.log("ERROR: failed to push because we ran out of retries.")
                self._finish(
                    Status.FAILURE,
                    f"failed to push {image}: {lines[-1]}",
                    FailureType.PUSH_FAILED,
                )
                return False
            build.results.images.append(
                cb.BuiltImage(name=image, digest=digest, push_timing=cb.TimeSpan(start_time=pushed_at, end_time=now()))
            )
        build.timing["PUSH"] = cb.TimeSpan(start_time=started, end_time=now())
        return True
