"""A promotion's links in the UI: the Cloud Run console for the service and the Cloud Build log of its image."""

from __future__ import annotations

import asyncio
import itertools

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

from blocks import ServingProfile
from flows.promote import promote_model
from tasks.common import clients
from tests.support.delivery import NO_WATCH
from tests.support.promotion import FAST

pytestmark = pytest.mark.prefect
_ids = itertools.count()


@pytest.fixture
def build_profile(tmp_path):
    """A ServingProfile block (l4) that builds its image with Cloud Build from a fresh folder (a new content tag)."""
    name = f"links-build-{next(_ids)}"
    (tmp_path / "Dockerfile").write_text("FROM python:3.12-slim\nCOPY . /app\n")
    (tmp_path / "app.py").write_text(f"print({name!r})\n")
    ServingProfile.preset("l4", image=None, build={"source_dir": str(tmp_path), "image_name": name}).save(name)
    return name


@pytest.fixture
def build_outcomes(sb):
    """Force the next builds' outcomes in the Cloud Build stand-in; restored after the test."""

    def force(*outcomes: str) -> None:
        sb.admin.post("/cloudbuild/outcomes", json={"outcomes": list(outcomes)}).raise_for_status()

    try:
        yield force
    finally:
        sb.admin.delete("/cloudbuild/outcomes").raise_for_status()


def _promote(service: str, profile: str):
    return promote_model(model="sandbox/tiny-chat", service=service, target="sandbox", profile=profile,
                         token_secret_block="sandbox-hf-token", verify=FAST, watch=NO_WATCH,
                         return_state=True)  # fmt: skip


def _artifacts(state) -> dict[str, tuple[str, str]]:
    """The run's artifacts by key: (type, data), as its Artifacts tab lists them."""

    async def read():
        async with get_client() as client:
            return await client.read_artifacts(
                artifact_filter=ArtifactFilter(
                    flow_run_id=ArtifactFilterFlowRunId(any_=[state.state_details.flow_run_id])
                )
            )

    return {a.key: (a.type, a.data) for a in asyncio.run(read()) if a.key}


def _build(target, build_id: str):
    return clients.cloud_build(target).get_build(name=f"{target.build_location_path}/builds/{build_id}")


def test_a_built_promotion_links_the_console_and_the_build_log(sb, flow_env, build_profile, build_outcomes):
    service = f"links-{next(_ids)}"
    build_outcomes("INTERNAL_ERROR")  # one OOM rung, then a build that succeeds
    state = _promote(service, build_profile)
    assert state.is_completed(), state.message
    built = _build(flow_env, state.result().image.attempts[-1].build_id)
    assert built.status.name == "SUCCESS" and built.log_url
    # On the target's defaults the build ran in Cloud Build's global location, which a new project may use.
    assert built.name == f"projects/{flow_env.project}/locations/global/builds/{built.id}"
    artifacts = _artifacts(state)
    console = (
        f"https://console.cloud.google.com/run/detail/{flow_env.region}/{service}/revisions?project={flow_env.project}"
    )
    assert artifacts[f"console-{service}"] == ("markdown", f"[{service} revisions in the Cloud Run console]({console})")
    assert artifacts[f"build-log-{service}"] == ("markdown", f"[Cloud Build log of {built.id}]({built.log_url})")
    report = artifacts[f"promotion-{service}"][1]
    first_screen = report.split("\n## Details\n")[0]
    assert f"| console | [Cloud Run revisions]({console}) · [Cloud Build log]({built.log_url}) |" in first_screen
    assert "| build attempts | 1. max_jobs=32: INTERNAL_ERROR in " in report


def test_a_failed_build_links_the_log_of_the_attempt_that_failed(sb, flow_env, build_profile, build_outcomes):
    service = f"links-{next(_ids)}"
    build_outcomes("FAILURE")  # not out of memory: no other rung is tried
    state = _promote(service, build_profile)
    assert state.is_failed() and "ended FAILURE" in state.message
    artifacts = _artifacts(state)
    link = artifacts[f"build-log-{service}"][1]
    build_id = link.removeprefix("[Cloud Build log of ").split("]")[0]
    failed = _build(flow_env, build_id)
    assert failed.status.name == "FAILURE" and link == f"[Cloud Build log of {failed.id}]({failed.log_url})"
    report = artifacts[f"promotion-{service}"][1]
    assert "| outcome | NOT promoted: the image step failed |" in report
    assert "| build attempts | 1. max_jobs=32: FAILURE in " in report and f"([log]({failed.log_url}))" in report
    assert f"[Cloud Build log]({failed.log_url})" in report.split("\n## Details\n")[0]
