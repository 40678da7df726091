"""Images against the sandbox: prebuilt pins, Cloud Build from a folder or a git repository, the OOM ladder."""

from __future__ import annotations

import io
import itertools
import subprocess
import tarfile
from pathlib import Path

import pytest

from blocks import GcpTarget, ImageBuild, ServingProfile
from tasks.common import clients
from tasks.image.builds import ImageBuildError, build_image, resolve_image
from tasks.image.images import build_plan, content_tag
from tests.support.build_target import fresh_build_target

# The target fixture's grants are the product's, made right before each build; a push denied while the repository's
# grant propagates is built again as one more attempt (test_build_identity.py covers it); these tests count attempts.
pytestmark = pytest.mark.usefixtures("grants_propagated")
_ids = itertools.count()
VLLM_LIKE = """\
FROM python:3.12-slim AS base
ARG max_jobs=32
ENV MAX_JOBS=${max_jobs}
RUN --mount=type=cache,target=/root/.cache pip install setuptools-scm
FROM base AS vllm-openai
COPY . /workspace
ENTRYPOINT ["vllm", "serve"]
"""


@pytest.fixture
def target(sandbox_target) -> GcpTarget:
    return fresh_build_target(sandbox_target, "builds-test", "builds")


def folder(tmp_path: Path, dockerfile: str = VLLM_LIKE, scm: bool = False) -> Path:
    src = tmp_path / f"src-{next(_ids)}"
    src.mkdir()
    (src / "Dockerfile").write_text(dockerfile)
    (src / "app.py").write_text("print('hello')\n")
    if scm:
        (src / "pyproject.toml").write_text('[build-system]\nrequires = ["setuptools", "setuptools-scm"]\n')
    return src


def git_repo(tmp_path: Path) -> Path:
    repo = folder(tmp_path, scm=True)
    for args in (["init", "-q", "-b", "main"], ["add", "."], ["-c", "user.email=t@e", "-c", "user.name=t", "commit",
                                                              "-qm", "v1"], ["tag", "v1.0"]):  # fmt: skip
        subprocess.run(["git", *args], cwd=repo, check=True)
    return repo


def build_posts(sb, since: int) -> int:
    return sum(
        1 for r in sb.requests("control", since=since) if r["method"] == "POST" and r["path"].endswith("/builds")
    )


def test_prebuilt_pin_is_used_as_is(target):
    result = resolve_image(target, ServingProfile.preset("l4"))
    assert (result.strategy, result.reused, result.attempts) == ("prebuilt", True, [])
    assert result.image == ServingProfile.preset("l4").image


def test_a_local_folder_is_built_once_and_reused_the_second_time(sb, target, tmp_path):
    build = ImageBuild(source_dir=str(folder(tmp_path)), image_name="app", max_jobs_ladder=[8, 4])
    first = build_image(target, build)
    assert not first.reused and [a.status for a in first.attempts] == ["SUCCESS"]
    assert "/cloud-build/builds;region=global/" in first.attempts[0].log_url  # the default build_region
    assert first.image.startswith(
        f"{target.region}-docker.pkg.dev/{target.project}/{target.artifact_repository}/app@sha256:"
    )
    since = sb.last_request_seq()
    second = build_image(target, build)
    assert second.reused and second.image == first.image and second.attempts == []
    assert build_posts(sb, since) == 0


def test_a_git_source_is_cloned_shallow_with_its_git_folder(sb, target, tmp_path):
    repo = git_repo(tmp_path)
    build = ImageBuild(git_url=f"file://{repo}", git_ref="v1.0", target="vllm-openai", image_name="from-git",
                       max_jobs_ladder=[8])  # fmt: skip
    result = build_image(target, build)
    assert [a.status for a in result.attempts] == ["SUCCESS"]  # setuptools-scm found its .git
    plan = build_plan(target, build, result.tag)
    data = clients.storage(target).bucket(plan.source_bucket).blob(plan.source_object).download_as_bytes()
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        names = archive.getnames()
    assert ".git/HEAD" in names and "Dockerfile" in names


def test_the_ladder_halves_max_jobs_until_the_build_fits(target, tmp_path):
    result = build_image(target, ImageBuild(source_dir=str(folder(tmp_path)), image_name="ladder"))
    assert [(a.max_jobs, a.status) for a in result.attempts] == [
        (32, "INTERNAL_ERROR"),
        (16, "INTERNAL_ERROR"),
        (8, "SUCCESS"),
    ]
    assert all(
        a.log_url.startswith("https://console.cloud.google.com/cloud-build/builds;region=") for a in result.attempts
    )


@pytest.mark.parametrize(
    ("action", "posts"),
    [("status", 2), ("replace", 1)],
    ids=["503-before-creating", "503-after-creating"],
)
def test_a_503_on_creating_a_build_never_builds_twice(sb, target, tmp_path, action, posts):
    # "status": Cloud Build answered 503 and created nothing; "replace": it created the build, the answer was lost.
    sb.add_fault("control", method="POST", path=r"/builds$", action=action, status=503, times=1)
    since = sb.last_request_seq()
    name = f"lost-{action}"
    build = ImageBuild(source_dir=str(folder(tmp_path, dockerfile="FROM python:3.12-slim\n")), image_name=name)
    result = build_image(target, build)
    assert [r["fired"] for r in sb.faults()] == [1]
    assert [(a.max_jobs, a.status) for a in result.attempts] == [(32, "SUCCESS")]
    assert build_posts(sb, since) == posts  # submitted again only when the first create made nothing
    builds = clients.cloud_build(target).list_builds(
        request={"project_id": target.project, "parent": target.build_location_path, "filter": f'tags="{name}"'}
    )
    assert len(list(builds)) == 1  # one build ran for the attempt, whichever way the 503 came


def test_a_build_region_cloud_build_restricts_fails_naming_the_setting_and_its_fixes(sb, target, tmp_path):
    # europe-west4 is one of the regions the sandbox's new project may not build in (Cloud Build's restriction).
    restricted = target.model_copy(update={"build_region": "europe-west4"})
    build = ImageBuild(source_dir=str(folder(tmp_path, dockerfile="FROM python:3.12-slim\n")), image_name="eu")
    with pytest.raises(ImageBuildError) as refused:
        build_image(restricted, build)
    message = str(refused.value)
    assert "Cloud Build may not run builds in europe-west4" in message
    assert "'due to quota restrictions, cannot run builds in this region'" in message
    assert "set the target's build_region to 'global' (the default" in message
    assert "us-central1, us-west2, europe-west1, asia-east1, australia-southeast1, southamerica-east1" in message
    quotas = "https://console.cloud.google.com/iam-admin/quotas?project=sandbox-project&metric="
    assert f"{quotas}cloudbuild.googleapis.com/concurrent_public_pool_build_cpus" in message  # the quota to ask for
    listed = clients.cloud_build(target).list_builds(
        request={"project_id": target.project, "parent": restricted.build_location_path}
    )
    assert list(listed) == []  # refused at create: no build, no attempt
    assert build_image(target, build).attempts[0].status == "SUCCESS"  # the default, global, builds it


def test_a_ladder_that_reaches_its_floor_fails_clearly(target, tmp_path):
    build = ImageBuild(source_dir=str(folder(tmp_path)), image_name="floor", max_jobs_floor=16)
    with pytest.raises(ImageBuildError, match=r"ran out of memory at every max_jobs down to the floor \(32, 16\)"):
        build_image(target, build)


@pytest.mark.parametrize(
    ("dockerfile", "scm", "fix"),
    [
        ("FROM python:3.12\nFOO bar\n", False, "fix the Dockerfile at the line shown"),
        (VLLM_LIKE, True, "keep .git in the build context (lesson 8)"),
    ],
    ids=["dockerfile-error", "setuptools-scm-without-git"],
)
def test_other_failures_fail_at_once_with_the_log_and_the_fix(target, tmp_path, dockerfile, scm, fix):
    build = ImageBuild(source_dir=str(folder(tmp_path, dockerfile, scm)), image_name="broken", max_jobs_ladder=[8, 4])
    with pytest.raises(ImageBuildError) as caught:
        build_image(target, build)
    message = str(caught.value)
    assert "ended FAILURE" in message and f"fix: {fix}" in message
    assert "log: https://console.cloud.google.com/cloud-build/builds;region=" in message
    assert "last lines:" in message and len(message.split("last lines:")[1].strip().splitlines()) <= 40


def test_internal_error_twice_then_success(sb, target, tmp_path):
    sb.admin.post("/cloudbuild/outcomes", json={"outcomes": ["INTERNAL_ERROR", "INTERNAL_ERROR"]}).raise_for_status()
    result = build_image(target, ImageBuild(source_dir=str(folder(tmp_path, "FROM python:3.12\n")), image_name="flaky"))
    assert [a.status for a in result.attempts] == ["INTERNAL_ERROR", "INTERNAL_ERROR", "SUCCESS"]


def forced_outcomes(sb, *outcomes: str) -> None:
    sb.admin.post("/cloudbuild/outcomes", json={"outcomes": list(outcomes)}).raise_for_status()


def submitted_jobs(sb, build_ids: list[str]) -> list[str]:
    """The max-jobs tag of each build as Cloud Build received it, in the order given."""
    builds = {b["id"]: b["build"] for b in sb.admin.get("/cloudbuild/state").json()["builds"]}
    return [next(t for t in builds[i]["tags"] if t.startswith("max-jobs-")) for i in build_ids]


def test_a_failure_with_the_compiler_killed_halves_max_jobs_and_the_next_attempt_succeeds(sb, target, tmp_path):
    forced_outcomes(sb, "OOM_KILLED")  # FAILURE, not INTERNAL_ERROR: the RUN fails after cc1plus is OOM-killed
    try:
        since = sb.last_request_seq()
        build = ImageBuild(source_dir=str(folder(tmp_path, "FROM python:3.12\n")), image_name="killed")
        result = build_image(target, build)
    finally:
        sb.admin.delete("/cloudbuild/outcomes").raise_for_status()
    assert [(a.max_jobs, a.status) for a in result.attempts] == [(32, "FAILURE"), (16, "SUCCESS")]
    assert build_posts(sb, since) == 2
    assert submitted_jobs(sb, [a.build_id for a in result.attempts]) == ["max-jobs-32", "max-jobs-16"]
    killed_log = sb.admin.get(f"/cloudbuild/logs/{result.attempts[0].build_id}").text
    assert "Killed signal terminated program cc1plus" in killed_log and "exit code: 137" in killed_log
    assert result.image.startswith(
        f"{target.region}-docker.pkg.dev/{target.project}/{target.artifact_repository}/killed@sha256:"
    )


def test_a_failure_without_a_kill_marker_is_not_retried(sb, target, tmp_path):
    forced_outcomes(sb, "FAILURE")  # the next build fails with no kill in its log
    try:
        since = sb.last_request_seq()
        # Left alone this build would only run out of memory at 32 and 16 jobs; a plain failure must not climb.
        build = ImageBuild(source_dir=str(folder(tmp_path)), image_name="plain-failure")
        with pytest.raises(ImageBuildError) as caught:
            build_image(target, build)
    finally:
        sb.admin.delete("/cloudbuild/outcomes").raise_for_status()
    message = str(caught.value)
    assert "ended FAILURE" in message and "ran out of memory" not in message
    assert "log: https://console.cloud.google.com/cloud-build/builds;region=" in message
    assert build_posts(sb, since) == 1


def test_content_tag_of_a_folder_build_is_stable(tmp_path):
    build = ImageBuild(source_dir=str(folder(tmp_path)), image_name="stable")
    from tasks.image.builds import source_digest

    assert content_tag(build, source_digest(build)) == content_tag(build, source_digest(build))


def test_serve_wrapper_recipe_builds_from_its_own_folder(target):
    result = build_image(target, ImageBuild(recipe="serve-wrapper"))
    assert [a.status for a in result.attempts] == ["SUCCESS"]
    assert result.image.startswith(
        f"{target.region}-docker.pkg.dev/{target.project}/{target.artifact_repository}/vllm-serve@sha256:"
    )
