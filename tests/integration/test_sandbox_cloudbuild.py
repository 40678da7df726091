"""Cloud Build stand-in through the real cloudbuild_v1 REST client: seed 000's build failures happen here."""

from __future__ import annotations

import io
import itertools
import tarfile
import uuid
from collections.abc import Iterator

import pytest
from google.api_core import exceptions
from google.cloud import artifactregistry_v1 as ar
from google.cloud.devtools import cloudbuild_v1 as cb
from google.protobuf import duration_pb2

from sandbox.control.cloudbuild.docker import MACHINES, BuildRequest, parse_build, simulate_build
from sandbox.control.cloudbuild.workspace import Workspace
from tasks.common import clients

Status = cb.Build.Status
FailureType = cb.Build.FailureInfo.FailureType
DOCKER = "gcr.io/cloud-builders/docker"
BUILD_SECONDS = 10.0  # simulated: 0.1 s per docker build at the default time scale
_ids = itertools.count()

SIMPLE = 'FROM python:3.12-slim\nCOPY app.py /app/app.py\nCMD ["python", "/app/app.py"]\n'
# The shape of vLLM's Dockerfile.cpu that matters: a max_jobs ARG feeding MAX_JOBS, a BuildKit cache mount,
# the source copied in with its .git, and a setup.py build that compiles.
VLLM_LIKE = """\
FROM ubuntu:22.04 AS base
ARG max_jobs=32
ENV MAX_JOBS=${max_jobs}
RUN --mount=type=cache,target=/root/.cache/pip pip install setuptools-scm cmake ninja
FROM base AS build
WORKDIR /workspace/vllm
COPY . .
RUN python3 setup.py bdist_wheel
FROM base AS vllm-openai
COPY --from=build /workspace/vllm/dist /dist
ENTRYPOINT ["vllm", "serve"]
"""
HIGHCPU_32 = cb.BuildOptions(machine_type=cb.BuildOptions.MachineType.E2_HIGHCPU_32)
SCM_PROJECT = '[build-system]\nrequires = ["setuptools>=64", "setuptools-scm>=8"]\n\n[tool.setuptools_scm]\n'


# Fixtures ---------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module", autouse=True)
def fast_builds(sandbox) -> Iterator[dict]:
    """Shorter docker builds for this module (through the admin API); the previous settings come back after."""
    before = sandbox.admin.get("/cloudbuild/state").json()["settings"]
    response = sandbox.admin.post("/cloudbuild/settings", json={"build_seconds": BUILD_SECONDS})
    response.raise_for_status()
    yield response.json()
    sandbox.admin.post("/cloudbuild/settings", json=before).raise_for_status()
    sandbox.admin.delete("/cloudbuild/outcomes").raise_for_status()


@pytest.fixture(scope="module", autouse=True)
def default_build_identity_is_editor(sandbox) -> Iterator[str]:
    """Builds here run as the Compute Engine default account, as Editor of the project: a project whose
    organization does not enforce iam.automaticIamGrantsForDefaultServiceAccounts. New projects' account has no
    role (the sandbox's default); test_build_identity_rights covers that."""
    member = f"serviceAccount:{sandbox.configure()['project_number']}-compute@developer.gserviceaccount.com"
    sandbox.admin.post(
        "/resourcemanager/caller-roles", json={"member": member, "roles": ["roles/editor"]}
    ).raise_for_status()
    yield member
    sandbox.admin.post("/resourcemanager/caller-roles", json={"member": member, "roles": []}).raise_for_status()


@pytest.fixture(scope="module")
def builds(sandbox_target) -> cb.CloudBuildClient:
    return clients.cloud_build(sandbox_target)


@pytest.fixture(scope="module")
def polling(sandbox_target):
    return clients.operation_polling(sandbox_target)


@pytest.fixture(scope="module")
def gcs(sandbox_target):
    return clients.storage(sandbox_target)


@pytest.fixture(scope="module")
def bucket(gcs) -> str:
    name = f"cb-src-{uuid.uuid4().hex[:10]}"
    gcs.create_bucket(name)
    return name


@pytest.fixture(scope="module")
def repo(sandbox_target, polling) -> str:
    """A Docker repository in the target's region; images go to ``{repo}/IMAGE:TAG``."""
    registry = clients.artifact_registry(sandbox_target)
    repository_id = f"cb-{uuid.uuid4().hex[:8]}"
    registry.create_repository(
        parent=sandbox_target.location_path,
        repository_id=repository_id,
        repository=ar.Repository(format_=ar.Repository.Format.DOCKER),
    ).result(timeout=30, polling=polling)
    return f"{sandbox_target.region}-docker.pkg.dev/{sandbox_target.project}/{repository_id}"


# Helpers ----------------------------------------------------------------------------------------------------------
def upload(gcs, bucket: str, files: dict[str, str]) -> str:
    """A tar.gz of ``files`` (a name ending in "/" is a folder) in the bucket; returns the object name."""
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:gz") as archive:
        for name, content in files.items():
            info = tarfile.TarInfo(name.rstrip("/"))
            if name.endswith("/"):
                info.type = tarfile.DIRTYPE
                archive.addfile(info)
                continue
            payload = content.encode()
            info.size = len(payload)
            archive.addfile(info, io.BytesIO(payload))
    name = f"source/{next(_ids)}-{uuid.uuid4().hex[:6]}.tar.gz"
    gcs.bucket(bucket).blob(name).upload_from_string(data.getvalue(), content_type="application/gzip")
    return name


def docker_build(bucket: str, source: str, args: list[str], images=(), buildkit=False, **fields) -> cb.Build:
    return cb.Build(
        source=cb.Source(storage_source=cb.StorageSource(bucket=bucket, object_=source)),
        steps=[cb.BuildStep(name=DOCKER, args=args, env=["DOCKER_BUILDKIT=1"] if buildkit else [])],
        images=list(images),
        **fields,
    )


def run(client, target, polling, build: cb.Build, regional: bool = False) -> tuple[cb.Build, object]:
    """Submit, wait, and read the build back: (build, what result() gave: the Build or the exception)."""
    if regional:
        operation = client.create_build(parent=target.location_path, build=build)
    else:
        operation = client.create_build(project_id=target.project, build=build)
    build_id = operation.metadata.build.id
    try:
        outcome: object = operation.result(timeout=60, polling=polling)
    except exceptions.GoogleAPICallError as exc:
        outcome = exc
    if regional:
        return client.get_build(name=f"{target.location_path}/builds/{build_id}"), outcome
    return client.get_build(project_id=target.project, id=build_id), outcome


def log_of(gcs, build: cb.Build) -> str:
    bucket, _, prefix = build.logs_bucket.removeprefix("gs://").partition("/")
    name = f"{prefix}/log-{build.id}.txt" if prefix else f"log-{build.id}.txt"
    return gcs.bucket(bucket).blob(name).download_as_text()


def find_image(sb, reference: str) -> dict | None:
    response = sb.admin.get("/artifactregistry/find", params={"ref": reference})
    return response.json() if response.status_code == 200 else None


def tag(repo: str, image: str = "app") -> str:
    return f"{repo}/{image}:t{next(_ids)}"


def archive(files: dict[str, str]) -> bytes:
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:gz") as tar:
        for name, content in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(content.encode())
            tar.addfile(info, io.BytesIO(content.encode()))
    return data.getvalue()


def slow_build() -> cb.Build:
    """Fifty no-op steps: 50 simulated seconds, long enough to cancel while it runs."""
    return cb.Build(steps=[cb.BuildStep(name="ubuntu", args=["sleep", "1"]) for _ in range(50)])


# A good build -----------------------------------------------------------------------------------------------------
def test_a_good_build_pushes_its_image_to_artifact_registry(sb, builds, sandbox_target, polling, gcs, bucket, repo):
    source = upload(gcs, bucket, {"Dockerfile": SIMPLE, "app.py": "print('hi')\n"})
    image = tag(repo)
    operation = builds.create_build(
        project_id=sandbox_target.project, build=docker_build(bucket, source, ["build", "-t", image, "."], [image])
    )
    assert operation.operation.name.startswith(f"operations/build/{sandbox_target.project}/")
    assert operation.metadata.build.status in (Status.QUEUED, Status.WORKING)
    result = operation.result(timeout=60, polling=polling)
    assert result.status == Status.SUCCESS

    build = builds.get_build(project_id=sandbox_target.project, id=result.id)
    assert build.status == Status.SUCCESS and build.project_id == sandbox_target.project
    assert build.create_time <= build.start_time <= build.finish_time
    assert {"FETCHSOURCE", "BUILD", "PUSH"} <= set(build.timing)
    assert [s.status for s in build.steps] == [Status.SUCCESS]
    assert build.log_url == (
        f"https://console.cloud.google.com/cloud-build/builds;region=global/{build.id}?project=123456789012"
    )
    assert build.timeout == duration_pb2.Duration(seconds=3600).ToTimedelta()  # the proto's default
    assert build.source_provenance.resolved_storage_source.generation > 0
    [built] = build.results.images
    assert built.name == image and built.digest.startswith("sha256:") and len(built.digest) == 71

    found = find_image(sb, image)
    assert found is not None and found["uri"].endswith(f"@{built.digest}")
    registry = clients.artifact_registry(sandbox_target)
    repository = f"{sandbox_target.location_path}/repositories/{repo.rsplit('/', 1)[1]}"
    assert any(i.uri.endswith(built.digest) for i in registry.list_docker_images(parent=repository))


def test_the_same_inputs_give_the_same_digest(builds, sandbox_target, polling, gcs, bucket, repo):
    source = upload(gcs, bucket, {"Dockerfile": SIMPLE, "app.py": "print('same')\n"})
    digests = []
    for _ in range(2):
        image = tag(repo, "same")
        build, _ = run(
            builds, sandbox_target, polling, docker_build(bucket, source, ["build", "-t", image, "."], [image])
        )
        digests.append(build.results.images[0].digest)
    assert digests[0] == digests[1]


def test_logs_land_in_the_logs_bucket_and_the_admin_api(sb, builds, sandbox_target, polling, gcs, bucket, repo):
    source = upload(gcs, bucket, {"Dockerfile": SIMPLE, "app.py": "print('log')\n"})
    image = tag(repo)
    request = docker_build(
        bucket, source, ["build", "-t", image, "."], [image], logs_bucket=f"gs://{bucket}/cloudbuild-logs"
    )
    build, _ = run(builds, sandbox_target, polling, request)
    assert build.logs_bucket == f"gs://{bucket}/cloudbuild-logs"
    text = log_of(gcs, build)
    lines = text.splitlines()
    assert lines[0] == f'starting build "{build.id}"'
    assert "FETCHSOURCE" in lines and "BUILD" in lines and "PUSH" in lines and lines[-1] == "DONE"
    assert "Step #0: Step 1/3 : FROM python:3.12-slim" in lines
    assert f"Pushing {image}" in lines
    assert sb.admin.get(f"/cloudbuild/logs/{build.id}").text == text


def test_the_default_logs_bucket_is_cloud_builds_own(builds, sandbox_target, polling, gcs, bucket):
    source = upload(gcs, bucket, {"Dockerfile": SIMPLE, "app.py": ""})
    build, _ = run(builds, sandbox_target, polling, docker_build(bucket, source, ["build", "."]))
    assert build.status == Status.SUCCESS
    assert build.logs_bucket == "gs://123456789012.cloudbuild-logs.googleusercontent.com"
    assert log_of(gcs, build).splitlines()[-1] == "DONE"


# Dockerfile and context failures ----------------------------------------------------------------------------------
def assert_failed(client, build: cb.Build, outcome, gcs, *messages: str) -> str:
    """FAILURE: the operation ends with error 2 and the build, readable, carries the failing step's reason."""
    assert build.status == Status.FAILURE
    assert isinstance(outcome, exceptions.Unknown) and "Build failed; check build logs for details" in str(outcome)
    assert build.failure_info.type_ == FailureType.USER_BUILD_STEP
    assert build.status_detail == (
        f'Build step failure: build step 0 "{DOCKER}" failed: step exited with non-zero status: 1'
    )
    assert build.steps[0].status == Status.FAILURE and build.steps[0].exit_code == 1
    text = log_of(gcs, build)
    for message in messages:
        assert message in text
    assert text.splitlines()[-2:] == ["ERROR", f"ERROR: {build.status_detail.removeprefix('Build step failure: ')}"]
    return text


def test_a_missing_dockerfile_fails(builds, sandbox_target, polling, gcs, bucket):
    source = upload(gcs, bucket, {"vllm/Dockerfile": SIMPLE})
    args = ["build", "-f", "vllm/docker/Dockerfile.cpu", "vllm"]
    build, outcome = run(builds, sandbox_target, polling, docker_build(bucket, source, args))
    assert_failed(
        builds,
        build,
        outcome,
        gcs,
        "Step #0: unable to prepare context: unable to evaluate symlinks in Dockerfile path: "
        "lstat /workspace/vllm/docker/Dockerfile.cpu: no such file or directory",
    )


def test_an_unknown_instruction_fails_with_its_line(builds, sandbox_target, polling, gcs, bucket):
    source = upload(gcs, bucket, {"Dockerfile": "FROM python:3.12\n\n# install\npip install vllm\n"})
    build, outcome = run(builds, sandbox_target, polling, docker_build(bucket, source, ["build", "."]))
    assert_failed(builds, build, outcome, gcs, "dockerfile parse error on line 4: unknown instruction: PIP")


def test_a_missing_target_fails(builds, sandbox_target, polling, gcs, bucket):
    source = upload(gcs, bucket, {"Dockerfile": "FROM python:3.12 AS base\nFROM base AS server\n"})
    args = ["build", "--target", "vllm-openai", "."]
    build, outcome = run(builds, sandbox_target, polling, docker_build(bucket, source, args))
    assert_failed(builds, build, outcome, gcs, "failed to reach build target vllm-openai in Dockerfile")


@pytest.mark.parametrize("buildkit", [False, True], ids=["classic-builder", "DOCKER_BUILDKIT=1"])
def test_run_mount_needs_buildkit(builds, sandbox_target, polling, gcs, bucket, buildkit):
    dockerfile = "FROM python:3.12\nRUN --mount=type=cache,target=/root/.cache/pip pip install requests\n"
    source = upload(gcs, bucket, {"Dockerfile": dockerfile})
    build, outcome = run(
        builds, sandbox_target, polling, docker_build(bucket, source, ["build", "."], buildkit=buildkit)
    )
    if buildkit:
        assert build.status == Status.SUCCESS and isinstance(outcome, cb.Build)
        return
    assert_failed(
        builds,
        build,
        outcome,
        gcs,
        "the --mount option requires BuildKit. Refer to https://docs.docker.com/go/buildkit/ to learn how to build "
        "images with BuildKit enabled",
    )


@pytest.mark.parametrize("with_git", [False, True], ids=["without-.git", "with-.git"])
def test_setuptools_scm_needs_git_in_the_context(builds, sandbox_target, polling, gcs, bucket, with_git):
    files = {"vllm/Dockerfile": VLLM_LIKE, "vllm/pyproject.toml": SCM_PROJECT, "vllm/setup.py": "setup()\n"}
    if with_git:
        files |= {"vllm/.git/": "", "vllm/.git/HEAD": "ref: refs/heads/main\n"}
    source = upload(gcs, bucket, files)
    args = ["build", "-f", "vllm/Dockerfile", "--target", "vllm-openai", "--build-arg", "max_jobs=8", "vllm"]
    request = docker_build(bucket, source, args, buildkit=True, options=HIGHCPU_32)
    build, outcome = run(builds, sandbox_target, polling, request)
    if with_git:
        assert build.status == Status.SUCCESS
        assert "Using MAX_JOBS=8 as the number of jobs." in log_of(gcs, build)
        return
    assert_failed(
        builds,
        build,
        outcome,
        gcs,
        "LookupError: setuptools-scm was unable to detect version for /workspace/vllm.",
        'ERROR: failed to solve: process "/bin/sh -c python3 setup.py bdist_wheel" did not complete successfully: '
        "exit code: 1",
    )


def test_a_dockerignored_git_folder_is_missing_too(builds, sandbox_target, polling, gcs, bucket):
    files = {"Dockerfile": VLLM_LIKE, "pyproject.toml": SCM_PROJECT, ".git/HEAD": "x", ".dockerignore": ".git\n"}
    source = upload(gcs, bucket, files)
    build, _ = run(builds, sandbox_target, polling, docker_build(bucket, source, ["build", "."], buildkit=True))
    assert build.status == Status.FAILURE
    assert "setuptools-scm was unable to detect version" in log_of(gcs, build)


@pytest.mark.parametrize("buildkit", [False, True], ids=["classic-builder", "DOCKER_BUILDKIT=1"])
def test_heredocs_are_buildkit_only(builds, sandbox_target, polling, gcs, bucket, buildkit):
    dockerfile = "FROM python:3.12\nRUN <<EOF\napt-get update\nEOF\n"
    source = upload(gcs, bucket, {"Dockerfile": dockerfile})
    build, _ = run(builds, sandbox_target, polling, docker_build(bucket, source, ["build", "."], buildkit=buildkit))
    assert build.status == (Status.SUCCESS if buildkit else Status.FAILURE)
    if not buildkit:  # the classic builder reads the heredoc's body as instructions
        assert "dockerfile parse error on line 3: unknown instruction: APT-GET" in log_of(gcs, build)


def test_a_copy_source_missing_from_the_context_fails(builds, sandbox_target, polling, gcs, bucket):
    files = {
        "Dockerfile": "FROM python:3.12\nCOPY requirements.txt app.py /app/\n",
        "app.py": "",
        ".dockerignore": "*.txt",
    }
    files["requirements.txt"] = "flask\n"  # present, but .dockerignore leaves it out of the context
    source = upload(gcs, bucket, files)
    build, outcome = run(builds, sandbox_target, polling, docker_build(bucket, source, ["build", "."]))
    assert_failed(
        builds,
        build,
        outcome,
        gcs,
        "COPY failed: file not found in build context or excluded by .dockerignore: stat requirements.txt: file "
        "does not exist",
    )


def test_an_upper_case_image_name_is_refused_by_docker(builds, sandbox_target, polling, gcs, bucket, repo):
    source = upload(gcs, bucket, {"Dockerfile": SIMPLE, "app.py": ""})
    image = f"{repo}/Qwen2.5-0.5B:v1"
    build, _ = run(builds, sandbox_target, polling, docker_build(bucket, source, ["build", "-t", image, "."], [image]))
    assert build.status == Status.FAILURE and build.steps[0].exit_code == 125
    assert "invalid reference format: repository name must be lowercase" in log_of(gcs, build)


# Out of memory ----------------------------------------------------------------------------------------------------
def test_max_jobs_32_and_16_exhaust_e2_highcpu_32_and_8_fits(builds, sandbox_target, polling, gcs, bucket, repo):
    files = {"Dockerfile": VLLM_LIKE, "pyproject.toml": SCM_PROJECT, "setup.py": "setup()\n", ".git/HEAD": "x"}
    source = upload(gcs, bucket, files)
    arrivals = []
    for max_jobs in (32, 16, 8):
        image = tag(repo, "vllm-cpu")
        args = ["build", "--target", "vllm-openai", "--build-arg", f"max_jobs={max_jobs}", "-t", image, "."]
        request = docker_build(
            bucket,
            source,
            args,
            [image],
            buildkit=True,
            options=HIGHCPU_32,
            timeout=duration_pb2.Duration(seconds=7200),
        )
        build, outcome = run(builds, sandbox_target, polling, request)
        text = log_of(gcs, build)
        assert f"Using MAX_JOBS={max_jobs} as the number of jobs." in text
        if max_jobs == 8:
            assert build.status == Status.SUCCESS and build.results.images[0].name == image
            continue
        # The builder was OOM-killed: INTERNAL_ERROR, not FAILURE, whichever way the operation delivered it.
        assert build.status == Status.INTERNAL_ERROR
        assert build.steps[0].status == Status.INTERNAL_ERROR and not build.results.images
        assert "c++: fatal error: Killed signal terminated program cc1plus" in text
        assert "did not complete successfully: exit code: 137" in text
        if isinstance(outcome, cb.Build):
            assert outcome.status == Status.INTERNAL_ERROR
            arrivals.append("build")
        else:
            assert isinstance(outcome, exceptions.InternalServerError)
            arrivals.append("error")
    assert sorted(arrivals) == ["build", "error"]  # consecutive INTERNAL_ERRORs alternate


def test_without_max_jobs_the_compile_uses_every_vcpu(builds, sandbox_target, polling, gcs, bucket):
    dockerfile = "FROM ubuntu:22.04\nRUN MAX_JOBS=$(nproc) python3 setup.py bdist_wheel  # max_jobs unset\n"
    source = upload(gcs, bucket, {"Dockerfile": dockerfile, "setup.py": ""})
    for machine, status in (("E2_HIGHCPU_8", Status.INTERNAL_ERROR), ("E2_MEDIUM", Status.SUCCESS)):
        request = docker_build(
            bucket, source, ["build", "."], options=cb.BuildOptions(machine_type=cb.BuildOptions.MachineType[machine])
        )
        build, _ = run(builds, sandbox_target, polling, request)
        assert build.status == status, machine


def test_a_build_that_never_mentions_max_jobs_has_no_compile(builds, sandbox_target, polling, gcs, bucket):
    source = upload(gcs, bucket, {"Dockerfile": "FROM python:3.12\nRUN pip install flask\n"})
    request = docker_build(
        bucket, source, ["build", "."], options=cb.BuildOptions(machine_type=cb.BuildOptions.MachineType.E2_MEDIUM)
    )
    build, _ = run(builds, sandbox_target, polling, request)
    assert build.status == Status.SUCCESS and "MAX_JOBS" not in log_of(gcs, build)


# Forced outcomes, timeouts, cancel --------------------------------------------------------------------------------
def test_forced_outcomes_apply_to_the_next_builds_then_clear(sb, builds, sandbox_target, polling, gcs, bucket):
    source = upload(gcs, bucket, {"Dockerfile": SIMPLE, "app.py": ""})
    queued = sb.admin.post("/cloudbuild/outcomes", json={"outcomes": ["INTERNAL_ERROR", "INTERNAL_ERROR"]})
    assert queued.json() == {"outcomes": ["INTERNAL_ERROR", "INTERNAL_ERROR"]}
    request = docker_build(bucket, source, ["build", "."])
    statuses = [run(builds, sandbox_target, polling, request)[0].status for _ in range(3)]
    assert statuses == [Status.INTERNAL_ERROR, Status.INTERNAL_ERROR, Status.SUCCESS]
    assert sb.admin.get("/cloudbuild/state").json()["outcomes"] == []


def test_forced_failure_and_timeout(sb, builds, sandbox_target, polling, gcs, bucket):
    source = upload(gcs, bucket, {"Dockerfile": SIMPLE, "app.py": ""})
    sb.admin.post("/cloudbuild/outcomes", json={"outcomes": ["FAILURE", "TIMEOUT", "AUTO"]}).raise_for_status()
    results = [run(builds, sandbox_target, polling, docker_build(bucket, source, ["build", "."])) for _ in range(3)]
    assert [b.status for b, _ in results] == [Status.FAILURE, Status.TIMEOUT, Status.SUCCESS]
    assert isinstance(results[0][1], exceptions.Unknown) and isinstance(results[1][1], exceptions.DeadlineExceeded)


def test_outcomes_are_validated(sb):
    response = sb.admin.post("/cloudbuild/outcomes", json={"outcomes": ["BROKEN"]})
    assert response.status_code == 400
    assert sb.admin.post("/cloudbuild/settings", json={"build_seconds": -1}).status_code == 400
    assert sb.admin.post("/cloudbuild/settings", json={"nope": 1}).status_code == 400


def test_a_build_longer_than_its_timeout_ends_timeout(builds, sandbox_target, polling, gcs, bucket):
    source = upload(gcs, bucket, {"Dockerfile": SIMPLE, "app.py": ""})
    request = docker_build(bucket, source, ["build", "."], timeout=duration_pb2.Duration(seconds=5))
    build, outcome = run(builds, sandbox_target, polling, request)
    assert build.status == Status.TIMEOUT and build.steps[0].status == Status.TIMEOUT
    assert isinstance(outcome, exceptions.DeadlineExceeded)
    assert log_of(gcs, build).splitlines()[-2:] == ["TIMEOUT", "ERROR: context deadline exceeded"]


def test_a_running_build_can_be_cancelled(builds, sandbox_target, polling):
    operation = builds.create_build(project_id=sandbox_target.project, build=slow_build())
    build_id = operation.metadata.build.id
    cancelled = builds.cancel_build(project_id=sandbox_target.project, id=build_id)
    assert cancelled.status == Status.CANCELLED
    with pytest.raises(exceptions.Cancelled):
        operation.result(timeout=30, polling=polling)
    assert builds.get_build(project_id=sandbox_target.project, id=build_id).status == Status.CANCELLED


@pytest.mark.parametrize("regional", [False, True], ids=["global", "regional"])
def test_cancelling_the_operation_cancels_the_build(builds, sandbox_target, polling, regional):
    if regional:
        operation = builds.create_build(parent=sandbox_target.location_path, build=slow_build())
    else:
        operation = builds.create_build(project_id=sandbox_target.project, build=slow_build())
    build_id = operation.metadata.build.id
    operation.cancel()
    with pytest.raises(exceptions.Cancelled):
        operation.result(timeout=30, polling=polling)
    if regional:
        build = builds.get_build(name=f"{sandbox_target.location_path}/builds/{build_id}")
    else:
        build = builds.get_build(project_id=sandbox_target.project, id=build_id)
    assert build.status == Status.CANCELLED and build.finish_time


def test_a_failed_build_can_be_retried_as_a_new_build(builds, sandbox_target, polling, gcs, bucket):
    source = upload(gcs, bucket, {"Dockerfile": "FROM python:3.12\nNOPE\n"})
    first, _ = run(builds, sandbox_target, polling, docker_build(bucket, source, ["build", "."]))
    operation = builds.retry_build(project_id=sandbox_target.project, id=first.id)
    retried_id = operation.metadata.build.id
    with pytest.raises(exceptions.Unknown):
        operation.result(timeout=60, polling=polling)
    retried = builds.get_build(project_id=sandbox_target.project, id=retried_id)
    assert retried_id != first.id and retried.status == Status.FAILURE and retried.steps[0].args == ["build", "."]


# Pushing ----------------------------------------------------------------------------------------------------------
def test_a_push_to_a_missing_repository_fails(builds, sandbox_target, polling, gcs, bucket):
    source = upload(gcs, bucket, {"Dockerfile": SIMPLE, "app.py": ""})
    image = f"{sandbox_target.region}-docker.pkg.dev/{sandbox_target.project}/no-such-repo/app:v1"
    build, outcome = run(
        builds, sandbox_target, polling, docker_build(bucket, source, ["build", "-t", image, "."], [image])
    )
    assert build.status == Status.FAILURE and isinstance(outcome, exceptions.Unknown)
    assert build.failure_info.type_ == FailureType.PUSH_FAILED
    text = log_of(gcs, build)
    assert 'name unknown: Repository "no-such-repo" not found' in text
    assert text.splitlines()[-1] == "ERROR: failed to push because we ran out of retries."


def test_an_image_no_step_built_is_not_found(builds, sandbox_target, polling, gcs, bucket, repo):
    source = upload(gcs, bucket, {"Dockerfile": SIMPLE, "app.py": ""})
    image = tag(repo)
    build, _ = run(builds, sandbox_target, polling, docker_build(bucket, source, ["build", "."], [image]))
    assert build.status == Status.FAILURE and build.failure_info.type_ == FailureType.PUSH_IMAGE_NOT_FOUND
    assert f'failed to find one or more images after execution of build steps: ["{image}"]' in build.status_detail


def test_a_docker_push_step_pushes_and_substitutions_apply(sb, builds, sandbox_target, polling, gcs, bucket, repo):
    source = upload(gcs, bucket, {"Dockerfile": SIMPLE, "app.py": ""})
    image = tag(repo.replace(sandbox_target.project, "$PROJECT_ID"), "${_NAME}")
    request = cb.Build(
        source=cb.Source(storage_source=cb.StorageSource(bucket=bucket, object_=source)),
        steps=[
            cb.BuildStep(name=DOCKER, args=["build", "-t", image, "."]),
            cb.BuildStep(name=DOCKER, args=["push", image]),
        ],
        substitutions={"_NAME": "pushed"},
    )
    build, _ = run(builds, sandbox_target, polling, request)
    assert build.status == Status.SUCCESS
    pushed = image.replace("$PROJECT_ID", sandbox_target.project).replace("${_NAME}", "pushed")
    assert build.steps[1].args == ["push", pushed]
    assert find_image(sb, pushed) is not None


def test_an_unmatched_substitution_is_refused(builds, sandbox_target, gcs, bucket):
    source = upload(gcs, bucket, {"Dockerfile": SIMPLE})
    request = docker_build(bucket, source, ["build", "-t", "img:$_TAG", "."])
    with pytest.raises(exceptions.BadRequest, match='key in the template "_TAG" is not matched'):
        builds.create_build(project_id=sandbox_target.project, build=request)


# Requests the API refuses -----------------------------------------------------------------------------------------
def test_a_missing_source_object_is_refused(builds, sandbox_target, bucket):
    request = docker_build(bucket, "source/nope.tar.gz", ["build", "."])
    with pytest.raises(exceptions.BadRequest, match=f"could not resolve source: .*No such object: {bucket}/"):
        builds.create_build(project_id=sandbox_target.project, build=request)


def test_a_missing_logs_bucket_is_refused(builds, sandbox_target, gcs, bucket):
    source = upload(gcs, bucket, {"Dockerfile": SIMPLE})
    request = docker_build(bucket, source, ["build", "."], logs_bucket="gs://no-such-logs-bucket-cb")
    with pytest.raises(exceptions.BadRequest, match='invalid bucket "no-such-logs-bucket-cb"'):
        builds.create_build(project_id=sandbox_target.project, build=request)


def test_another_project_is_forbidden(builds):
    with pytest.raises(exceptions.Forbidden):
        builds.create_build(project_id="someone-elses-project", build=cb.Build(steps=[cb.BuildStep(name="ubuntu")]))
    with pytest.raises(exceptions.Forbidden):
        builds.get_build(project_id="someone-elses-project", id="x")


def test_an_unknown_build_is_not_found(builds, sandbox_target):
    with pytest.raises(exceptions.NotFound):
        builds.get_build(project_id=sandbox_target.project, id=str(uuid.uuid4()))


# Regional builds --------------------------------------------------------------------------------------------------
def test_a_regional_build_runs_through_the_shared_operation_store(
    sb, builds, sandbox_target, polling, gcs, bucket, repo
):
    source = upload(gcs, bucket, {"Dockerfile": SIMPLE, "app.py": ""})
    image = tag(repo)
    request = docker_build(bucket, source, ["build", "-t", image, "."], [image], tags=["regional-test"])
    operation = builds.create_build(parent=sandbox_target.location_path, build=request)
    assert operation.operation.name.startswith(f"{sandbox_target.location_path}/operations/")
    result = operation.result(timeout=60, polling=polling)
    assert result.status == Status.SUCCESS
    assert result.name == f"{sandbox_target.location_path}/builds/{result.id}"
    assert f"builds;region={sandbox_target.region}/{result.id}" in result.log_url
    assert operation.metadata.build.status == Status.SUCCESS  # the metadata follows the build
    again = builds.get_build(name=result.name)
    assert again.status == Status.SUCCESS and find_image(sb, image) is not None

    regional = list(
        builds.list_builds(
            request=cb.ListBuildsRequest(parent=sandbox_target.location_path, filter='tags="regional-test"')
        )
    )
    assert [b.id for b in regional] == [result.id]
    global_ids = {b.id for b in builds.list_builds(project_id=sandbox_target.project)}
    assert result.id not in global_ids  # builds are regional resources
    with pytest.raises(exceptions.NotFound):
        builds.get_build(project_id=sandbox_target.project, id=result.id)


def test_a_regional_build_where_the_project_is_restricted_is_refused_with_cloud_builds_text(
    sb, builds, sandbox_target, polling, gcs, bucket, repo
):
    # The sandbox's defaults restrict the project as Cloud Build restricts some new ones: europe-west4 refuses the
    # build at create; the global location (and us-central1, test above) runs the same request.
    source = upload(gcs, bucket, {"Dockerfile": SIMPLE, "app.py": ""})
    image = tag(repo)
    request = docker_build(bucket, source, ["build", "-t", image, "."], [image], tags=["restricted-test"])
    restricted = f"projects/{sandbox_target.project}/locations/europe-west4"
    with pytest.raises(exceptions.BadRequest) as refused:
        builds.create_build(parent=restricted, build=request)
    assert refused.value.response.json()["error"] == {
        "code": 400,
        "message": "failed precondition: due to quota restrictions, cannot run builds in this region. Please contact "
        "support",
        "status": "FAILED_PRECONDITION",
    }
    assert list(builds.list_builds(request=cb.ListBuildsRequest(parent=restricted))) == []  # nothing was created
    everywhere = f"projects/{sandbox_target.project}/locations/global"
    result = builds.create_build(parent=everywhere, build=request).result(timeout=60, polling=polling)
    assert result.status == Status.SUCCESS and result.name == f"{everywhere}/builds/{result.id}"
    assert f"builds;region=global/{result.id}" in result.log_url and find_image(sb, image) is not None


def test_list_filters_by_status(builds, sandbox_target, polling, gcs, bucket):
    source = upload(gcs, bucket, {"Dockerfile": "FROM python:3.12\nBAD line\n"})
    build, _ = run(builds, sandbox_target, polling, docker_build(bucket, source, ["build", "."], tags=["listed"]))
    failed = builds.list_builds(project_id=sandbox_target.project, filter='status="FAILURE" AND tags="listed"')
    assert build.id in {b.id for b in failed}
    with pytest.raises(exceptions.BadRequest, match="unsupported filter"):
        list(builds.list_builds(project_id=sandbox_target.project, filter="substitutions._X=1"))


# The seed's own build, without a server: vLLM's Dockerfile.cpu, condensed to the parts that fail ---------------
DOCKERFILE_CPU = """\
FROM ubuntu:25.04 AS base
RUN --mount=type=cache,target=/var/cache/apt,sharing=locked \\
    apt-get update -y && apt-get install -y --no-install-recommends ca-certificates curl git
ARG TARGETARCH
FROM base AS base-common
WORKDIR /workspace
ARG max_jobs=32
ENV MAX_JOBS=${max_jobs}
RUN apt-get install -y --no-install-recommends ccache git make cmake ninja-build
FROM base-common AS vllm-triton-cpu-build
WORKDIR /vllm-workspace
RUN --mount=type=cache,target=/root/.cache/uv \\
    git clone https://github.com/triton-lang/triton-cpu.git && cd triton-cpu && uv build --wheel --out-dir=../dist
FROM base-common AS base-amd64
COPY requirements/cpu.txt requirements/cpu.txt
FROM base-${TARGETARCH} AS base-arch
FROM base-arch AS vllm-src
WORKDIR /vllm-workspace
COPY . .
FROM vllm-src AS vllm-build
RUN --mount=type=cache,target=/root/.cache/uv VLLM_TARGET_DEVICE=cpu python3 setup.py bdist_wheel --dist-dir=dist
FROM vllm-src AS vllm-dev
RUN --mount=type=bind,source=.git,target=.git VLLM_TARGET_DEVICE=cpu python3 setup.py develop
FROM base-arch AS vllm-openai
RUN --mount=type=bind,from=vllm-build,src=/vllm-workspace/dist,target=dist uv pip install dist/*.whl
RUN --mount=type=bind,from=vllm-triton-cpu-build,src=/vllm-workspace/dist,target=dist uv pip install dist/*.whl
ENTRYPOINT ["vllm", "serve"]
"""
VLLM_TREE = {
    "vllm/docker/Dockerfile.cpu": DOCKERFILE_CPU,
    "vllm/requirements/cpu.txt": "torch\n",
    "vllm/pyproject.toml": SCM_PROJECT,
    "vllm/setup.py": "setup()\n",
    "vllm/.git/HEAD": "ref: refs/heads/main\n",
}


def seed_build(max_jobs: int, files: dict[str, str] = VLLM_TREE, buildkit: bool = True):
    """The seed's step: docker build -f vllm/docker/Dockerfile.cpu --target vllm-openai ... on E2_HIGHCPU_32."""
    args = ["-f", "vllm/docker/Dockerfile.cpu", "--target", "vllm-openai", "--build-arg", f"max_jobs={max_jobs}"]
    request = BuildRequest(
        command=parse_build([*args, "-t", "asia-southeast1-docker.pkg.dev/p/r/vllm-cpu:latest", "vllm"]),
        workspace=Workspace.from_archive(archive(files)),
        step_dir="",
        env={"DOCKER_BUILDKIT": "1"} if buildkit else {},
        buildkit=buildkit,
        machine=MACHINES["E2_HIGHCPU_32"],
        memory_per_job_gb=2.5,
        build_seconds=60,
    )
    return simulate_build(request)


def test_the_seeds_cpu_build_oom_kills_in_the_triton_stage_until_max_jobs_8():
    for max_jobs in (32, 16):
        outcome = seed_build(max_jobs)
        assert (outcome.status, outcome.exit_code, outcome.jobs) == ("INTERNAL_ERROR", 137, max_jobs)
        failing = next(line for line in outcome.lines if line.startswith("ERROR: failed to solve"))
        assert "uv build --wheel" in failing and failing.endswith("exit code: 137")
    outcome = seed_build(8)
    assert outcome.status == "SUCCESS" and outcome.jobs == 8
    assert list(outcome.images) == ["asia-southeast1-docker.pkg.dev/p/r/vllm-cpu:latest"]
    assert not any("vllm-dev" in line for line in outcome.lines)  # BuildKit builds only what the target needs


def test_the_seeds_cpu_build_without_git_or_buildkit_fails_as_reported():
    without_git = {k: v for k, v in VLLM_TREE.items() if "/.git/" not in k}
    outcome = seed_build(8, without_git)
    assert outcome.status == "FAILURE"
    text = "\n".join(outcome.lines)
    assert "LookupError: setuptools-scm was unable to detect version for /vllm-workspace." in text
    assert any("setup.py bdist_wheel" in line and "exit code: 1" in line for line in outcome.lines)
    classic = seed_build(8, buildkit=False)
    assert classic.status == "FAILURE"
    assert classic.lines[-1].startswith("the --mount option requires BuildKit.")
    assert "Step 2/" in classic.lines[-2]  # the first RUN --mount stops the classic builder


def test_a_built_image_keeps_its_final_stages_workdir_where_a_job_starts():
    """Docker's WORKDIR, relative ones joined and inherited through FROM a stage; a Cloud Run job's task starts there
    (sandbox/control/run/jobs.py): the worker image runs `prefect flow-run execute` in /opt/hf-cloudrun-pipeline."""
    dockerfile = "FROM python:3.11 AS base\nWORKDIR /opt\nFROM base AS app\nWORKDIR project\nCOPY . .\n"
    request = BuildRequest(
        command=parse_build(["-t", "us-central1-docker.pkg.dev/p/r/app:v1", "."]),
        workspace=Workspace.from_archive(archive({"Dockerfile": dockerfile, "main.py": "print()\n"})),
        step_dir="",
        env={"DOCKER_BUILDKIT": "1"},
        buildkit=True,
        machine=MACHINES["E2_HIGHCPU_32"],
        memory_per_job_gb=2.5,
        build_seconds=1,
    )
    outcome = simulate_build(request)
    assert outcome.status == "SUCCESS" and outcome.config is not None
    assert outcome.config.workdir == "/opt/project"
