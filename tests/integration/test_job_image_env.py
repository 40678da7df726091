"""A Cloud Run job runs in its image's Python environment: what the Dockerfile installed, not this host's packages.

A tiny project is built by the product (tasks/image/builds.py: its folder uploaded with .dockerignore applied, built by
the sandbox's Cloud Build), then run as a job through googleapiclient's run v2 client, as prefect-gcp's worker does.
Its code imports ``six``, which this host's venv has: a pyproject that forgets it must still fail in the job, as the
image would in production. The base is ``python:3.11-slim`` (an empty venv) to keep the test quick; the worker tier
(tests/worker) runs the real ./Dockerfile, FROM prefecthq/prefect.
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import httpx
import pytest
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud.devtools import cloudbuild_v1 as cb
from googleapiclient import discovery

from blocks import GcpTarget, ImageBuild
from tasks.common import clients
from tasks.image.builds import ImageBuildError, build_image
from tests.support.build_target import fresh_build_target

pytestmark = pytest.mark.usefixtures("grants_propagated")  # the product's build grants, made right before the build
_ids = itertools.count()
DOCKERFILE = """\
FROM python:3.11-slim
WORKDIR /srv/greeter
COPY . .
RUN pip install --no-cache-dir -e .
"""
MAIN = """\
import os
from pathlib import Path
print("cwd", os.getcwd())
print("files", sorted(p.name for p in Path.cwd().iterdir()))
import six
print("six", six.__version__)
"""


@pytest.fixture
def target(sandbox_target) -> GcpTarget:
    return fresh_build_target(sandbox_target, "jobenv", "jobenv")


@pytest.fixture(scope="module")
def locations(sandbox):
    options = ClientOptions(api_endpoint=sandbox.info["control_url"])
    client = discovery.build("run", "v2", client_options=options, credentials=AnonymousCredentials())
    return client.projects().locations()


def project(tmp_path: Path, dependencies: list[str], dockerfile: str = DOCKERFILE) -> Path:
    """A project whose code imports six, declaring ``dependencies``; notes.txt is left out by its .dockerignore."""
    src = tmp_path / f"greeter-{next(_ids)}"
    (src / "greeter").mkdir(parents=True)
    (src / "Dockerfile").write_text(dockerfile)
    (src / ".dockerignore").write_text("notes.txt\n")
    (src / "notes.txt").write_text("not for the image\n")
    deps = ", ".join(f'"{d}"' for d in dependencies)
    (src / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=61"]\nbuild-backend = "setuptools.build_meta"\n\n'
        f'[project]\nname = "greeter"\nversion = "0.1.0"\ndependencies = [{deps}]\n\n'
        '[tool.setuptools]\npackages = ["greeter"]\n'
    )
    (src / "greeter" / "__init__.py").write_text("")
    (src / "greeter" / "__main__.py").write_text(MAIN)
    return src


def run_job(locations, parent: str, image: str, timeout: float = 600) -> dict:
    """Create a job running ``python -m greeter`` in the image, run it, and wait for its execution to complete."""
    job_id = f"greeter-{next(_ids)}"
    task = {"containers": [{"image": image, "command": ["python", "-m", "greeter"]}], "maxRetries": 0}
    locations.jobs().create(parent=parent, jobId=job_id, body={"template": {"template": task}}).execute()
    operation = locations.jobs().run(name=f"{parent}/jobs/{job_id}", body={}).execute()
    deadline = time.monotonic() + timeout  # the first run makes the image's environment (pip): a busy host is slow
    while time.monotonic() < deadline:
        execution = locations.jobs().executions().get(name=operation["metadata"]["name"]).execute()
        if "completionTime" in execution:
            return execution
        time.sleep(0.5)
    raise TimeoutError(f"{job_id} did not complete in {timeout} s")


def logs(sandbox, execution: dict, stream: str) -> str:
    """What the execution's logUri shows of one stream, through Cloud Logging's entries.list."""
    query = parse_qs(urlparse(execution["logUri"]).query)
    project_id, log_filter = query["project"][0], query["advancedFilter"][0]
    log_filter += f'\nlogName="projects/{project_id}/logs/run.googleapis.com%2F{stream}"'
    body = {"resourceNames": [f"projects/{project_id}"], "filter": log_filter, "orderBy": "timestamp asc"}
    entries = httpx.post(f"{sandbox.info['control_url']}/v2/entries:list", json=body, timeout=30).json()
    return "\n".join(e["textPayload"] for e in entries.get("entries", []))


def completed(execution: dict) -> dict:
    return next(c for c in execution["conditions"] if c["type"] == "Completed")


@pytest.mark.slow
def test_a_dependency_missing_from_the_image_fails_the_job_and_declaring_it_fixes_it(
    sandbox, target, locations, tmp_path
):
    forgot = build_image(target, ImageBuild(source_dir=str(project(tmp_path, [])), image_name="greeter"))
    failed = run_job(locations, target.location_path, forgot.image)
    assert completed(failed)["state"] == "CONDITION_FAILED", failed
    assert "ModuleNotFoundError: No module named 'six'" in logs(sandbox, failed, "stderr")
    # It ran from the image's WORKDIR, in the build context as uploaded (.dockerignore applied).
    out = logs(sandbox, failed, "stdout")
    assert "cwd " in out and out.split("cwd ", 1)[1].splitlines()[0].endswith("/srv/greeter"), out
    assert "'pyproject.toml'" in out and "notes.txt" not in out, out

    declared = build_image(target, ImageBuild(source_dir=str(project(tmp_path, ["six"])), image_name="greeter"))
    assert declared.image != forgot.image
    passed = run_job(locations, target.location_path, declared.image)
    assert completed(passed)["state"] == "CONDITION_SUCCEEDED", (passed, logs(sandbox, passed, "stderr"))
    assert "six 1." in logs(sandbox, passed, "stdout")


def test_a_prefect_image_step_the_sandbox_cannot_follow_fails_the_build_naming_it(target, tmp_path):
    dockerfile = "FROM prefecthq/prefect:3.9.1-python3.11\nCOPY . /opt/app\nRUN apt-get update && pip install .\n"
    build = ImageBuild(source_dir=str(project(tmp_path, [], dockerfile)), image_name="apt", max_jobs_ladder=[8])
    with pytest.raises(ImageBuildError) as failed:
        build_image(target, build)
    text = str(failed.value)
    assert "Dockerfile line 3" in text and "apt-get update" in text, text
    builds = clients.cloud_build(target).list_builds(
        request={"project_id": target.project, "parent": target.build_location_path, "filter": 'tags="apt"'}
    )
    assert [b.status for b in builds] == [cb.Build.Status.FAILURE]
