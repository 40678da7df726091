"""The bad-input catalogue (issue 8): what a user plausibly types, and what the pipeline answers.

Each case runs what the user runs (the promote-model or scale-service flow in-process, or a block built as the
UI builds it) with ONE bad input, and checks that the error names the field AND says what to do, and that no
cloud write (POST/PUT/PATCH/DELETE on the control plane or GCS) happened before it. Hub and CDN reads are fine.
"""

from __future__ import annotations

import asyncio
import itertools

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import BlockDocumentUpdate

from blocks import GcpTarget, ImageBuild, ServingProfile, VllmOptions
from flows.scale import scale_service
from flows.teardown import teardown
from tasks.common import clients
from tasks.deploy.render import CPU_PROBE_LIMIT_S, GPU_PROBE_LIMIT_S, PROBE_PERIOD_S
from tests.support.artifacts import artifact
from tests.support.bad_input import (
    cloud_writes,
    fails_cleanly,
    new_repo,
    new_service,
    promote,
    saved_profile,
    saved_target,
)

pytestmark = pytest.mark.prefect
_ids = itertools.count()


# promote-model parameters -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("params", "field", "fix"),
    [
        pytest.param({"model": "google gemma"}, "repo_id 'google gemma'", "write 'namespace/name'", id="model-spaces"),
        pytest.param(
            {"model": "https://huggingface.co/sandbox/tiny-chat"}, "repo_id", "give the repo id only", id="model-url"
        ),
        pytest.param({"model": "sandbox/tiny-chat/main"}, "repo_id", "write 'namespace/name'", id="model-3-parts"),
        pytest.param({"model": "sandbox/no-such-model"}, "repo id", "token_secret_block", id="model-not-on-hub"),
        pytest.param(
            {"revision": "no-such-branch"}, "revision not found", "use a branch, tag or full", id="revision-unknown"
        ),
        pytest.param({"revision": "0" * 40}, "revision not found", "use a branch, tag or full", id="revision-sha"),
        pytest.param({"revision": "release 2"}, "revision 'release 2'", "without spaces", id="revision-spaces"),
        pytest.param(
            {"token_secret_block": "Sandbox-HF-Token"}, "token_secret_block", "lowercase letters", id="secret-caps"
        ),
        pytest.param(
            {"token_secret_block": "no-such-secret"},
            "token_secret_block",
            "prefect block create secret",
            id="secret-block-missing",
        ),
        pytest.param({"hub_endpoint": "huggingface.co"}, "hub_endpoint", "with scheme", id="hub-endpoint-scheme"),
        pytest.param(
            {"allow_patterns": ["*.gguf"]}, "allow_patterns=['*.gguf']", "Adjust allow_patterns", id="empty-selection"
        ),
        pytest.param(
            {"ignore_patterns": ["config.json"]},
            "no config.json",
            "from ignore_patterns",
            id="weights-without-config",
        ),
        pytest.param({"profile": "a100"}, "profile: 'a100'", "preset (l4, rtx-pro-6000, cpu)", id="profile-unknown"),
        pytest.param({"target": "staging"}, "target:", "python -m flows.bootstrap", id="target-unknown"),
        pytest.param({"load_mode": "gcs"}, "load_mode", "'gcs-volume' or 'runai-streamer'", id="load-mode"),
        pytest.param(
            {"image": "vllm/vllm-openai:v0.33.0"}, "image", "set allow_generic_vllm_image", id="generic-image-on-l4"
        ),
        pytest.param(
            {"image": "us-docker.pkg.dev/acme-ml-prod/images/vllm"},
            "image",
            "name a tag other than latest",
            id="image-unpinned",
        ),
        pytest.param({"service": "s" * 40}, "service", "use at most 37 characters", id="service-too-long"),
        pytest.param(
            {"service": "TinyChat"},
            "service",
            "lowercase",
            id="service-uppercase",
        ),
    ],
)
def test_promote_parameter(sb, flow_env, params, field, fix):
    fails_cleanly(sb, lambda: promote(**params), field, fix)


def test_gated_repo_without_any_token(sb, flow_env, monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    message = fails_cleanly(
        sb,
        lambda: promote(model="sandbox/gated-chat", token_secret_block=None),
        "ModelSource.token_secret_block",
        "accept its licence",
    )
    assert "HF_TOKEN" in message


def test_a_runtime_token_without_any_token(sb, flow_env, monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    profile = saved_profile("bi-l4-runtime-token", hf_token_at_runtime=True)
    fails_cleanly(
        sb, lambda: promote(profile=profile, token_secret_block=None), "hf_token_at_runtime", "token_secret_block"
    )


def test_missing_model(sb, flow_env):
    fails_cleanly(sb, lambda: promote(model=None), "model:", "give a Hub repo id")


def test_spec_file_that_does_not_exist(sb, flow_env):
    fails_cleanly(sb, lambda: promote(model=None, spec_file="deployments/tiny-chta.yaml"), "spec_file", "deployments/")


# promote-model with saved blocks ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("preset", "region", "gpu"),
    [("rtx-pro-6000", "europe-west1", "nvidia-rtx-pro-6000"), ("l4", "us-west1", "nvidia-l4")],
    ids=["rtx-in-europe-west1", "l4-in-us-west1"],
)
def test_gpu_not_offered_in_the_targets_region(sb, flow_env, preset, region, gpu):
    profile = saved_profile(f"bi-{preset}-custom", preset)
    target = saved_target(flow_env, f"bi-{region}", region=region)
    message = fails_cleanly(
        sb,
        lambda: promote(profile=profile, target=target),
        f"gpu_type: {gpu} is not offered in {region}",
        "use a region with it",
    )
    assert "us-central1" in message  # one of the regions that has it


@pytest.mark.usefixtures("raised_quota")  # the GPU quota (3 L4) must bind: a new project's 40 GiB holds 1 instance
def test_max_instances_above_the_gpu_quota(sb, flow_env):
    profile = saved_profile("bi-l4-five", max_instances=5)
    fails_cleanly(sb, lambda: promote(profile=profile), "max_instances", "set max_instances to 3 or fewer")


def test_bucket_in_another_region_fails_before_any_write(sb, flow_env):
    bucket = f"bi-eu-weights-{next(_ids)}"
    storage = clients.storage(flow_env)
    storage.create_bucket(storage.bucket(bucket), location="europe-west4")  # setup, before `since` is taken
    target = saved_target(flow_env, "bi-eu-bucket", bucket=bucket)
    message = fails_cleanly(
        sb, lambda: promote(target=target), "GcpTarget.bucket", "set GcpTarget.bucket to a new name"
    )
    assert "EUROPE-WEST4" in message.upper() and "us-central1" in message


def test_a_build_region_cloud_build_restricts_fails_before_any_write(sb, flow_env, tmp_path):
    # europe-west4: a region the sandbox's new project may not build in (Cloud Build's regional restriction).
    (tmp_path / "Dockerfile").write_text("FROM python:3.12-slim\n")
    profile = saved_profile("bi-build-eu", image=None, build={"source_dir": str(tmp_path), "image_name": "bi-eu"})
    target = saved_target(flow_env, "bi-build-eu", build_region="europe-west4")
    message = fails_cleanly(
        sb, lambda: promote(target=target, profile=profile), "build_region", "set the target's build_region to 'global'"
    )
    assert "Cloud Build may not run builds in europe-west4" in message


def test_build_source_without_a_dockerfile_dry_run(sb, flow_env, tmp_path):
    profile = saved_profile("bi-no-dockerfile", image=None, build={"source_dir": str(tmp_path)})
    fails_cleanly(sb, lambda: promote(profile=profile, dry_run=True), "build.dockerfile", "set dockerfile")


def test_build_source_without_a_dockerfile(sb, flow_env, tmp_path):
    profile = saved_profile("bi-no-dockerfile", image=None, build={"source_dir": str(tmp_path)})
    model = new_repo(sb, "no-dockerfile")
    fails_cleanly(sb, lambda: promote(model=model, profile=profile), "build.dockerfile", "set dockerfile")


@pytest.mark.parametrize(
    ("block", "base", "bad", "field", "fix"),
    [
        pytest.param(
            ServingProfile,
            ServingProfile.preset("l4"),
            {"cpu": 2},
            "cpu",
            "set cpu to 4",
            id="profile-cpu",
        ),
        pytest.param(
            GcpTarget, None, {"invokers": ["allUsers"]}, "invokers", "list the users, groups", id="target-invokers"
        ),
    ],
)
def test_block_saved_through_the_ui_with_a_bad_value(sb, flow_env, block, base, bad, field, fix):
    name = f"bi-ui-{block.get_block_type_slug()}"
    (base or flow_env).save(name, overwrite=True)

    async def edit():  # what the UI's block form does: PATCH the document's data
        async with get_client() as client:
            document = await client.read_block_document_by_name(name, block.get_block_type_slug())
            data = {**document.data, **bad}
            await client.update_block_document(document.id, BlockDocumentUpdate(data=data, merge_existing_data=False))

    asyncio.run(edit())
    kwargs = {"profile": name} if block is ServingProfile else {"target": name}
    fails_cleanly(sb, lambda: promote(**kwargs), field, fix)


@pytest.mark.parametrize(
    ("overrides", "field", "fix"),
    [
        ({"concurrency": 8}, "concurrency", "leave concurrency empty for twice max_num_seqs"),
        ({"vllm": {"max_num_seqs": 2048}}, "vllm.max_num_seqs", "lower max_num_seqs to 1000 or less"),
    ],
    ids=["concurrency-below-max-num-seqs", "max-num-seqs-above-1000"],
)
def test_a_batch_cloud_run_can_never_fill(sb, flow_env, overrides, field, fix):
    profile = saved_profile(f"bi-l4-unfillable-{field.replace('.', '-').replace('_', '-')}", **overrides)
    fails_cleanly(sb, lambda: promote(profile=profile), field, fix)


@pytest.mark.parametrize(("preset", "limit_s"), [("l4", GPU_PROBE_LIMIT_S), ("cpu", CPU_PROBE_LIMIT_S)])
def test_a_load_rate_too_low_for_the_probe_is_capped_at_cloud_runs_limit(sb, flow_env, preset, limit_s):
    # 4 MiB at 1 kB/s is over an hour of loading: the window is capped at Cloud Run's limit, and preflight passes.
    profile = saved_profile(f"bi-{preset}-slow-load", preset, load_rate_mb_s=0.001)
    service = new_service()
    since = sb.last_request_seq()
    report = promote(profile=profile, service=service, dry_run=True)
    assert report.outcome == "dry-run"
    assert not [f for f in report.findings if f.severity == "error"]
    assert f"failureThreshold: {limit_s // PROBE_PERIOD_S}\n" in artifact(f"plan-{service}")
    # ...and the plan says the weights will not load in that window, and what to change
    warnings = [f.message for f in report.findings if f.setting == "load_rate_mb_s"]
    assert len(warnings) == 1 and "raise load_rate_mb_s if the storage is faster" in warnings[0]
    assert cloud_writes(sb, since) == []


# scale-service ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def served(flow_env):
    """One promoted service for the scale cases; torn down afterwards."""
    service = new_service()
    promote(service=service)
    yield service
    teardown(service=service)


def test_scale_with_an_unknown_target(sb, flow_env):
    fails_cleanly(
        sb,
        lambda: scale_service(service="tiny-chat", min_instances=0, target="staging"),
        "target:",
        "python -m flows.bootstrap",
    )


def test_scale_with_min_instances_that_is_not_a_number(sb, flow_env):
    fails_cleanly(sb, lambda: scale_service(service="tiny-chat", min_instances="one"), "min_instances", "valid integer")


def test_scale_a_service_that_does_not_exist(sb, flow_env):
    fails_cleanly(sb, lambda: scale_service(service="bi-nope", min_instances=1), "service", "promote-model")


@pytest.mark.parametrize(
    ("params", "field", "fix"),
    [
        pytest.param({"min_instances": -1}, "min_instances", "min must be 0 or more", id="min-negative"),
        pytest.param({"min_instances": 2, "max_instances": 1}, "max_instances", "min at most max", id="min>max"),
    ],
)
def test_scale_with_impossible_instance_counts(sb, served, params, field, fix):
    fails_cleanly(sb, lambda: scale_service(service=served, **params), field, fix)


# Blocks as the UI builds them ---------------------------------------------------------------------------------
RTX = {"gpu_type": "nvidia-rtx-pro-6000"}


@pytest.mark.parametrize(
    ("values", "field", "fix"),
    [
        pytest.param({**RTX, "cpu": 16, "memory_gib": 80}, "cpu: nvidia-rtx-pro-6000", "set cpu to 20", id="cpu-min"),
        pytest.param(
            {**RTX, "cpu": 20, "memory_gib": 64},
            "memory_gib: nvidia-rtx-pro-6000",
            "set memory_gib to 80",
            id="memory-min",
        ),
        pytest.param({"max_instances": 0}, "max_instances", "greater than or equal to 1", id="max-instances-0"),
        pytest.param({"memory_gib": 100000}, "memory_gib", "less than or equal to 128", id="memory-absurd"),
        pytest.param(
            {"request_timeout_seconds": 999999},
            "request_timeout_seconds",
            "less than or equal to 3600",
            id="timeout-absurd",
        ),
        pytest.param({"load_rate_mb_s": 0}, "load_rate_mb_s", "greater than 0", id="load-rate-0"),
        pytest.param({"gpu_type": "nvidia-a100"}, "gpu_type", "'nvidia-l4' or 'nvidia-rtx-pro-6000'", id="gpu-a100"),
        pytest.param(
            {"vllm": {"gpu_memory_utilization": 2}},
            "vllm.gpu_memory_utilization",
            "less than or equal to 1",
            id="gpu-mem-util-2",
        ),
        pytest.param({"vllm": {"max_num_seqs": 0}}, "vllm.max_num_seqs", "greater than or equal to 1", id="seqs-0"),
        pytest.param({"vllm": {"dtype": "fp16"}}, "vllm.dtype", "'bfloat16', 'float16'", id="dtype-fp16"),
        pytest.param(
            {"vllm": {"enable_auto_tool_choice": True, "reasoning_parser": "deepseek_r1"}},
            "vllm.tool_call_parser",
            "set tool_call_parser",
            id="tool-choice-without-parser",
        ),
        pytest.param(
            {"image": "us-docker.pkg.dev/acme/images/vllm:1", "build": {"recipe": "serve-wrapper"}},
            "image and build",
            "set exactly one",
            id="image-and-build",
        ),
        pytest.param(
            {"image": None, "build": {"git_url": "https://github.com/vllm-project/vllm.git"}},
            "build.git_ref",
            "pin the git source",
            id="build-git-unpinned",
        ),
        pytest.param(
            {"vllm": {"extra_args": ["--port", "8000"]}},
            "vllm.extra_args: '--port'",
            "set it there",
            id="extra-args-port",
        ),
        pytest.param(
            {"vllm": {"extra_args": ["--model=org/model"]}},
            "vllm.extra_args: '--model'",
            "remove it from extra_args",
            id="extra-args-model",
        ),
        pytest.param(
            {"vllm": {"extra_args": ["--port 8000"]}},
            "vllm.extra_args",
            "Split it",
            id="extra-args-port-one-item",
        ),
        pytest.param(
            {"env": {"HUGGING_FACE_HUB_TOKEN": "hf_x"}},
            "env: HUGGING_FACE_HUB_TOKEN",
            "token_secret_block",
            id="hub-token-in-env",
        ),
        pytest.param({"mount_path": "/dev/models"}, "mount_path '/dev/models'", "use e.g. '/mnt/models'", id="mnt-dev"),
        pytest.param({"mount_path": "/proc/weights"}, "mount_path", "use e.g. '/mnt/models'", id="mnt-proc"),
    ],
)
def test_serving_profile_built_in_the_ui(sb, values, field, fix):
    fails_cleanly(sb, lambda: ServingProfile(**values), field, fix)


TARGET = {"project": "acme-ml-prod", "region": "us-central1"}


@pytest.mark.parametrize(
    ("values", "field", "fix"),
    [
        pytest.param({"bucket": "gs://acme-models"}, "bucket 'gs://acme-models'", "without gs://", id="bucket-gs"),
        pytest.param({"bucket": "Acme Models"}, "bucket", "lowercase letters", id="bucket-spaces"),
        pytest.param({"region": "europe-west"}, "region 'europe-west'", "such as 'us-central1'", id="region"),
        pytest.param({"subnet_range": "192.168.4.0/27"}, "subnet_range", "use e.g. '10.8.0.0/26'", id="subnet-small"),
        pytest.param({"subnet_range": "34.120.0.0/26"}, "subnet_range", "private (RFC 1918)", id="subnet-public"),
        pytest.param(
            {"endpoints": {"storage": "localhost:4443"}}, "endpoints.storage", "with its scheme", id="endpoint-scheme"
        ),
        pytest.param(
            {"endpoints": {"storage": "http://127.0.0.1:4443/storage/v1"}},
            "endpoints.storage",
            "and no path",
            id="endpoint-path",
        ),
        pytest.param(
            {"endpoints": {}, "anonymous_credentials": True},
            "anonymous_credentials",
            "set endpoints",
            id="anonymous-without-endpoints",
        ),
        pytest.param(
            {"invokers": ["allAuthenticatedUsers"]}, "invokers", "list the users, groups", id="invokers-public"
        ),
    ],
)
def test_gcp_target_built_in_the_ui(sb, values, field, fix):
    fails_cleanly(sb, lambda: GcpTarget(**{**TARGET, **values}), field, fix)


def test_vllm_options_and_image_build_alone(sb):
    fails_cleanly(sb, lambda: VllmOptions(max_model_len=8), "max_model_len", "greater than or equal to 16")
    fails_cleanly(
        sb, lambda: ImageBuild(recipe="vllm-cpu", build_args={"MAX_JOBS": "8"}), "build.build_args", "set the ladder"
    )


# Business hours and unknown keys in model files: tests/reliability/test_bad_input_fields.py.
