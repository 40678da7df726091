"""Configuration blocks: presets carry the field lessons, bad values name the field and the fix."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from blocks import GcpTarget, ModelSource, ServingProfile
from blocks.hardware import GPUS, MODEL_GARDEN_VLLM_IMAGE


def error_text(model, **values) -> str:
    with pytest.raises(ValidationError) as caught:
        model(**values)
    return str(caught.value)


def test_l4_preset_is_seed_000s_working_deploy():
    profile = ServingProfile.preset("l4")
    assert (profile.cpu, profile.memory_gib, profile.gpu_type) == (8, 32, "nvidia-l4")
    assert profile.gpu_zonal_redundancy is False
    assert profile.image == MODEL_GARDEN_VLLM_IMAGE
    assert profile.vllm.enforce_eager is True
    assert profile.container_port == 8080
    assert profile.effective_concurrency == 2 * profile.vllm.max_num_seqs
    assert profile.max_instances <= GPUS["nvidia-l4"].default_quota  # fits a new project's GPU quota
    assert round(profile.hourly_usd, 2) == 1.42  # FACTS.md: L4 + 8 vCPU + 32 GiB is about $1.42/h


def test_rtx_pro_6000_preset_meets_its_minimums_with_zonal_redundancy_off():
    profile = ServingProfile.preset("rtx-pro-6000")
    assert (profile.cpu, profile.memory_gib, profile.gpu_type) == (20, 80, "nvidia-rtx-pro-6000")
    assert profile.gpu_zonal_redundancy is False


def test_cpu_preset_has_the_cpu_mode_environment():
    profile = ServingProfile.preset("cpu")
    assert (profile.cpu, profile.memory_gib, profile.gpu_type) == (4, 10, None)
    assert profile.env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert profile.env["VLLM_HOST_IP"] == "127.0.0.1"
    assert profile.env["GLOO_SOCKET_IFNAME"] == "lo"
    assert "VLLM_CPU_KVCACHE_SPACE" in profile.env
    assert profile.image is None and profile.build is not None and profile.build.recipe == "vllm-cpu"
    assert (profile.build.dockerfile, profile.build.target) == ("docker/Dockerfile.cpu", "vllm-openai")


def test_preset_overrides_apply_and_unknown_preset_lists_the_choices():
    assert ServingProfile.preset("l4", max_instances=3).max_instances == 3
    with pytest.raises(ValueError, match="choose one of l4, rtx-pro-6000, cpu"):
        ServingProfile.preset("a100")


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({"cpu": 2}, "cpu: nvidia-l4 needs at least 4 vCPU"),
        ({"memory_gib": 8}, "memory_gib: nvidia-l4 needs at least 16 GiB"),
        ({"gpu_type": "nvidia-rtx-pro-6000"}, "cpu: nvidia-rtx-pro-6000 needs at least 20 vCPU"),
        ({"min_instances": 2, "max_instances": 1}, "min_instances (2) is above max_instances (1)"),
        ({"mount_path": "/dev/shm"}, "mount_path '/dev/shm': Cloud Run refuses mounts under /dev"),
        ({"mount_path": "models"}, "must be an absolute directory"),
        ({"env": {"PORT": "8000"}}, "env: PORT is set by Cloud Run from container_port"),
        ({"env": {"HF_TOKEN": "x"}}, "env: HF_TOKEN must not be stored in plain text"),
        ({"cpu_always_allocated": False}, "cpu_always_allocated: GPU services need CPU always allocated"),
        ({"image": None}, "image and build: set exactly one"),
        ({"build": {"source_dir": "/src"}}, "image and build: set exactly one"),
        ({"concurrency": 0}, "concurrency"),
        ({"request_timeout_seconds": 7200}, "request_timeout_seconds"),
        ({"vllm": {"gpu_memory_utilization": 1.5}}, "gpu_memory_utilization"),
        ({"vllm": {"max_num_seqs": 0}}, "max_num_seqs"),
        ({"vllm": {"enable_auto_tool_choice": True}}, "vllm.enable_auto_tool_choice needs vllm.tool_call_parser"),
        ({"vllm": {"extra_args": ["--port=8000"]}}, "'--port' is rendered from container_port"),
        ({"vllm": {"extra_args": ["--model", "x"]}}, "'--model' is rendered from (the model is positional"),
        ({"vllm": {"extra_args": ["--no-enable-prefix-caching"]}}, "controlled by vllm.enable_prefix_caching"),
        ({"vllm": {"dtype": "int3"}}, "dtype"),
        ({"vllm": {"max_model_len": 4}}, "max_model_len"),
    ],
)
def test_bad_profile_values_name_the_field(values, expected):
    message = error_text(ServingProfile.preset, name="l4", **values)
    assert expected in message


def test_the_build_bucket_is_never_the_model_bucket_and_is_a_valid_name():
    where = {"project": "acme-ml-prod", "region": "europe-west4"}
    message = error_text(GcpTarget, **where, bucket="shared", build_bucket="shared")
    assert "build_bucket 'shared' is the model bucket; builds need a bucket of their own" in message
    message = error_text(GcpTarget, **where, build_bucket="gs://builds")
    assert "build_bucket 'gs://builds': give the bucket name without gs://" in message
    # The longest project id in the longest region: the derived name is too long, and the error says what to set.
    message = error_text(GcpTarget, project="a" * 30, region="northamerica-northeast1", bucket="weights")
    assert "is not a valid bucket name" in message and "set build_bucket explicitly" in message


def test_target_defaults_follow_the_codelab_naming():
    target = GcpTarget(project="acme-ml-prod", region="europe-west4")
    assert target.bucket_name == "acme-ml-prod-europe-west4-hf-model-cache"
    assert target.build_bucket_name == "acme-ml-prod-europe-west4-hf-builds"  # sources and logs: not the weights
    assert target.model_prefix == "model-cache"
    assert target.subnet_range == "10.8.0.0/26"
    assert target.service_account_email == "vllm-serving@acme-ml-prod.iam.gserviceaccount.com"
    assert target.endpoint("run") is None  # Google's public endpoint
    # Builds run in Cloud Build's global location, which a new project may use; images still go to europe-west4.
    assert target.build_region == "global"
    assert target.build_location_path == "projects/acme-ml-prod/locations/global"


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({"project": "Acme Prod"}, "project 'Acme Prod' is not a GCP project id"),
        ({"project": "123456789012"}, "is not a GCP project id"),
        ({"region": "us-central1-a"}, "region 'us-central1-a' is not a GCP region name"),
        ({"build_region": "us-central1-a"}, "build_region 'us-central1-a' is not a Cloud Build location: use 'global'"),
        ({"bucket": "My_Bucket"}, "bucket 'My_Bucket' is not a valid bucket name"),
        ({"bucket": "google-models"}, "is not a valid bucket name"),
        ({"subnet_range": "10.8.0.0/28"}, "subnet_range '10.8.0.0/28' is too small"),
        ({"subnet_range": "8.8.8.0/24"}, "must be a private (RFC 1918) range"),
        ({"subnet_range": "10.8.0.1/26"}, "is not an IPv4 CIDR range"),
        ({"service_account_name": "sa"}, "service_account_name 'sa' must be 6-30"),
        ({"network": "VPC_1"}, "network 'VPC_1' must be 1-63 lowercase letters"),
        ({"labels": {"Team": "ml"}}, "labels: 'Team=ml' is not a valid GCP label"),
        ({"invokers": ["allUsers"]}, "invokers: 'allUsers' would make the service public"),
        ({"invokers": ["alice@example.com"]}, "write it as 'user:EMAIL'"),
        ({"model_prefix": "../x"}, "model_prefix"),
        ({"anonymous_credentials": True}, "anonymous_credentials is only for targets whose endpoints point at"),
        ({"endpoints": {"run": "127.0.0.1:8123"}}, "must be a base URL with its scheme"),
        ({"endpoints": {"rnu": "http://127.0.0.1:1"}}, "rnu"),
    ],
)
def test_bad_target_values_name_the_field(values, expected):
    message = error_text(GcpTarget, **{"project": "acme-ml-prod", "region": "us-central1", **values})
    assert expected in message


def test_target_for_a_sandbox_keeps_endpoints_without_trailing_slash():
    target = GcpTarget(
        project="sandbox-project",
        region="us-central1",
        endpoints={"run": "http://127.0.0.1:8123/", "storage": "http://127.0.0.1:9000"},
        anonymous_credentials=True,
    )
    assert target.endpoint("run") == "http://127.0.0.1:8123"
    assert target.endpoint("cloudbuild") is None


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({"repo_id": "https://huggingface.co/google/gemma"}, "is a URL; give the repo id only"),
        ({"repo_id": "google/gemma/extra"}, "is not a Hub repo id"),
        ({"repo_id": "google/-bad"}, "is not a Hub repo id"),
        ({"repo_id": "a--b/c"}, "is not a Hub repo id"),
        ({"revision": "my branch"}, "revision 'my branch' must be a branch, tag or commit sha"),
        ({"allow_patterns": []}, "allow_patterns: give non-empty glob patterns"),
        ({"token_secret_block": "hf_abcdefghijklmnopqrstuvwxyz0123456789"}, "must be the NAME of a Prefect Secret"),
        ({"hub_endpoint": "huggingface.co"}, "hub_endpoint 'huggingface.co' must be a base URL with scheme"),
    ],
)
def test_bad_model_source_values_name_the_field(values, expected):
    message = error_text(ModelSource, **{"repo_id": "google/gemma-4-E2B-it", **values})
    assert expected in message


def test_model_source_defaults():
    source = ModelSource(repo_id="google/gemma-4-E2B-it")
    assert source.revision == "main"
    assert source.served_model_name == "google/gemma-4-E2B-it"
