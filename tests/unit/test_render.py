"""Rendering the Cloud Run service, vLLM argv and probe from a profile: pure, no servers."""

from __future__ import annotations

import shlex

import pytest
import yaml

from blocks import GcpTarget, ImageBuild, ModelSource, ServingProfile
from blocks.hardware import MODEL_GARDEN_VLLM_IMAGE
from tasks.deploy.render import (
    Weights,
    container_args,
    gcloud_command,
    probe_failure_threshold,
    render_service,
    revision_name,
    running_value,
    service_yaml,
)

TARGET = GcpTarget(project="acme-ml-prod", region="us-central1")
SOURCE = ModelSource(repo_id="google/gemma-4-E2B-it")
SHA = "0123456789abcdef0123456789abcdef01234567"
WEIGHTS = Weights(
    repo_id=SOURCE.repo_id,
    commit=SHA,
    bucket=TARGET.bucket_name,
    object_prefix=f"model-cache/{SOURCE.repo_id}/{SHA}",
    total_bytes=10 * 10**9,
)


def render(profile: ServingProfile, image: str | None = None):
    return render_service(profile, TARGET, SOURCE, WEIGHTS, image or profile.image or "", revision="svc-rev")


def test_l4_service_matches_seed_000s_working_deploy():
    profile = ServingProfile.preset("l4")
    service = render(profile)
    template = service.template
    container = template.containers[0]
    assert container.image == MODEL_GARDEN_VLLM_IMAGE
    assert dict(container.resources.limits) == {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "1"}
    assert container.resources.cpu_idle is False  # --no-cpu-throttling
    assert template.node_selector.accelerator == "nvidia-l4"
    assert template.gpu_zonal_redundancy_disabled is True
    assert template.execution_environment.name == "EXECUTION_ENVIRONMENT_GEN2"
    assert template.scaling.max_instance_count == 1 and template.scaling.min_instance_count == 0
    assert template.max_instance_request_concurrency == 2 * profile.vllm.max_num_seqs
    assert template.service_account == TARGET.service_account_email
    assert service.invoker_iam_disabled is False
    interface = template.vpc_access.network_interfaces[0]
    assert (interface.network, interface.subnetwork) == (TARGET.network, TARGET.subnet)
    assert template.vpc_access.egress.name == "ALL_TRAFFIC"
    env = {e.name: e.value for e in container.env}
    assert env["HF_HUB_OFFLINE"] == "1"


def test_args_start_with_vllm_serve_and_the_model_is_positional_from_the_mount():
    args = list(render(ServingProfile.preset("l4")).template.containers[0].args)
    assert args[:3] == ["vllm", "serve", f"/mnt/models/google/gemma-4-E2B-it/{SHA}"]
    assert args[args.index("--served-model-name") + 1] == "google/gemma-4-E2B-it"
    assert args[args.index("--port") + 1] == "8080" and args[args.index("--host") + 1] == "0.0.0.0"
    assert "--enforce-eager" in args and "--enable-prefix-caching" in args and "--enable-chunked-prefill" in args
    assert not any(a.startswith("--model") for a in args)


def test_the_volume_mounts_only_the_model_prefix_read_only():
    service = render(ServingProfile.preset("l4"))
    (volume,) = service.template.volumes
    assert volume.gcs.bucket == TARGET.bucket_name and volume.gcs.read_only
    assert "only-dir=model-cache" in volume.gcs.mount_options
    assert service.template.containers[0].volume_mounts[0].mount_path == "/mnt/models"


def test_runai_streamer_reads_the_gs_commit_folder_without_a_volume():
    service = render(ServingProfile.preset("l4", load_mode="runai-streamer"))
    args = list(service.template.containers[0].args)
    assert args[2] == f"gs://{TARGET.bucket_name}/model-cache/google/gemma-4-E2B-it/{SHA}"
    assert args[args.index("--load-format") + 1] == "runai_streamer"
    assert list(service.template.volumes) == []


def test_images_that_start_vllm_serve_themselves_get_the_model_first():
    generic = "vllm/vllm-openai:v0.33.0"
    profile = ServingProfile.preset("rtx-pro-6000", image=generic)
    assert container_args(profile, generic, "/m", "name")[:2] == ["/m", "--served-model-name"]


def test_cpu_profile_renders_the_cpu_environment_and_no_gpu():
    profile = ServingProfile.preset("cpu")
    service = render(profile, image="us-central1-docker.pkg.dev/acme-ml-prod/vllm-images/vllm-cpu@sha256:ab")
    container = service.template.containers[0]
    env = {e.name: e.value for e in container.env}
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0" and env["GLOO_SOCKET_IFNAME"] == "lo"
    assert "nvidia.com/gpu" not in container.resources.limits
    assert not service.template.node_selector.accelerator
    assert "--gpu-memory-utilization" not in container.args


def test_serve_wrapper_gets_the_model_through_the_environment():
    profile = ServingProfile.preset("l4", image=None, build=ImageBuild(recipe="serve-wrapper"))
    container = render(profile, image="us-central1-docker.pkg.dev/p/r/vllm-serve@sha256:ab").template.containers[0]
    env = {e.name: e.value for e in container.env}
    assert env["MODEL_PATH"] == f"/mnt/models/google/gemma-4-E2B-it/{SHA}"
    assert env["SERVED_MODEL_NAME"] == "google/gemma-4-E2B-it"
    assert "--port" not in container.args and "--enforce-eager" in container.args


def test_startup_probe_is_seed_001s_httpget_sized_from_the_weights_within_limits():
    profile = ServingProfile.preset("l4")
    probe = render(profile).template.containers[0].startup_probe
    assert (probe.http_get.path, probe.initial_delay_seconds, probe.period_seconds, probe.timeout_seconds) == (
        "/health", 5, 2, 2,
    )  # fmt: skip
    assert probe.failure_threshold >= 120
    small, big = probe_failure_threshold(profile, 10**9), probe_failure_threshold(profile, 100 * 10**9)
    assert big > small
    assert probe_failure_threshold(profile, 10**13) * 2 <= 1800  # Cloud Run's GPU ceiling
    assert probe_failure_threshold(ServingProfile.preset("cpu"), 10**13) * 2 <= 600
    eager_off = ServingProfile.preset("l4", vllm={"enforce_eager": False})
    assert probe_failure_threshold(eager_off, 10**9) * 2 >= 330 + 60  # room for the compile


def test_revision_names_are_deterministic_and_change_with_the_inputs():
    profile = ServingProfile.preset("l4")
    name = revision_name("gemma", WEIGHTS, "img:1", profile)
    assert name == revision_name("gemma", WEIGHTS, "img:1", profile)
    assert name.startswith("gemma-0123456-") and len(name) <= 63
    assert revision_name("gemma", WEIGHTS, "img:2", profile) != name
    assert revision_name("gemma", WEIGHTS, "img:1", ServingProfile.preset("l4", max_instances=2)) != name


def test_gcloud_command_is_the_seed_command_with_our_defaults_and_no_secret_values():
    service = render(ServingProfile.preset("l4"))
    command = gcloud_command("gemma", TARGET, service)
    words = shlex.split(command.replace("\\\n", " "))
    assert words[:4] == ["gcloud", "run", "deploy", "gemma"]
    expected = {
        "--gpu=1", "--gpu-type=nvidia-l4", "--no-gpu-zonal-redundancy", "--no-cpu-throttling",
        "--no-allow-unauthenticated", "--execution-environment=gen2", "--port=8080", "--max-instances=1",
    }  # fmt: skip
    assert expected <= set(words)
    probe = next(w for w in words if w.startswith("--startup-probe="))
    assert "httpGet.path=/health" in probe and "failureThreshold=" in probe
    args = next(w for w in words if w.startswith("--args="))
    assert args.startswith("--args=vllm,serve,/mnt/models/")


def test_gcloud_command_keeps_an_arg_with_commas_whole():
    config = '{"max_tokens":64,"temperature":0}'
    service = render(ServingProfile.preset("l4", vllm={"extra_args": ["--override-generation-config", config]}))
    words = shlex.split(gcloud_command("gemma", TARGET, service).replace("\\\n", " "))
    args = next(w for w in words if w.startswith("--args="))
    delimiter = args[len("--args=^")]
    assert args.startswith(f"--args=^{delimiter}^vllm{delimiter}serve{delimiter}")
    assert args.split(f"^{delimiter}^", 1)[1].split(delimiter)[-2:] == ["--override-generation-config", config]


def test_service_yaml_is_knative_with_the_gpu_and_volume():
    document = yaml.safe_load(service_yaml("gemma", TARGET, render(ServingProfile.preset("l4"))))
    assert document["apiVersion"] == "serving.knative.dev/v1"
    template = document["spec"]["template"]
    assert template["metadata"]["annotations"]["run.googleapis.com/cpu-throttling"] == "false"
    assert template["spec"]["nodeSelector"] == {"run.googleapis.com/accelerator": "nvidia-l4"}
    assert template["spec"]["volumes"][0]["csi"]["driver"] == "gcsfuse.run.googleapis.com"
    assert template["metadata"]["name"] == "svc-rev"


def option(args: list[str], flag: str) -> str | bool | None:
    """What the user sees for one `vllm serve` flag: its value, True for a bare switch, None when absent."""
    assert args.count(flag) <= 1, f"{flag} rendered more than once: {args}"
    if flag not in args:
        return None
    following = args[args.index(flag) + 1 :]
    return following[0] if following and not following[0].startswith("--") else True


CUSTOM_VLLM = {
    "dtype": "float16",
    "max_model_len": 32768,
    "max_num_seqs": 16,
    "gpu_memory_utilization": 0.85,
    "quantization": "awq",
    "kv_cache_dtype": "fp8_e4m3",
    "tool_call_parser": "hermes",
    "reasoning_parser": "deepseek_r1",
    "enable_auto_tool_choice": True,
    "extra_args": ["--limit-mm-per-prompt", '{"image":4}', "--trust-remote-code"],
}
TEAM_TARGET = GcpTarget(project="acme-ml-prod", region="us-central1", labels={"team": "ml", "env": "prod"})
GEMMA_LABELS = {"hf-model": "google-gemma-4-e2b-it", "hf-commit": SHA[:12]}
RENDER_CASES = {
    # case: (profile, target, labels, timeout s, volume mount options, flags as the user sees them, argv tail)
    "l4-preset": (
        ServingProfile.preset("l4"),
        TARGET,
        {"managed-by": "hf-cloudrun-pipeline", **GEMMA_LABELS},
        600,
        ["only-dir=model-cache"],
        {
            "--safetensors-load-strategy": "eager",
            "--dtype": "bfloat16", "--max-model-len": "8192", "--max-num-seqs": "64",
            "--gpu-memory-utilization": "0.9", "--quantization": None, "--kv-cache-dtype": None,
            "--tool-call-parser": None, "--reasoning-parser": None, "--enable-auto-tool-choice": None,
        },
        ["--enforce-eager", "--enable-prefix-caching", "--enable-chunked-prefill"],
    ),
    "custom-vllm": (
        ServingProfile.preset("l4", request_timeout_seconds=1800, vllm=CUSTOM_VLLM, gcs_buffered_read=True),
        TEAM_TARGET,
        {"team": "ml", "env": "prod", **GEMMA_LABELS},
        1800,
        ["only-dir=model-cache", "enable-buffered-read=true"],
        {
            "--dtype": "float16", "--max-model-len": "32768", "--max-num-seqs": "16",
            "--gpu-memory-utilization": "0.85", "--quantization": "awq", "--kv-cache-dtype": "fp8_e4m3",
            "--tool-call-parser": "hermes", "--reasoning-parser": "deepseek_r1", "--enable-auto-tool-choice": True,
        },
        ["--enable-auto-tool-choice", "--limit-mm-per-prompt", '{"image":4}', "--trust-remote-code"],
    ),
}  # fmt: skip


@pytest.mark.parametrize(
    ("profile", "target", "labels", "timeout_s", "mount_options", "flags", "tail"),
    RENDER_CASES.values(),
    ids=RENDER_CASES.keys(),
)
def test_rendered_labels_timeout_volume_and_vllm_flags(profile, target, labels, timeout_s, mount_options, flags, tail):
    service = render_service(profile, target, SOURCE, WEIGHTS, profile.image or "", revision="svc-rev")
    template = service.template
    assert dict(template.labels) == labels
    assert dict(service.labels) == labels
    assert template.timeout.total_seconds() == timeout_s
    (volume,) = template.volumes
    assert (volume.gcs.bucket, volume.gcs.read_only, list(volume.gcs.mount_options)) == (
        target.bucket_name, True, mount_options,
    )  # fmt: skip
    args = list(template.containers[0].args)
    assert args[:2] == ["vllm", "serve"]
    assert {flag: option(args, flag) for flag in flags} == flags
    assert args[-len(tail) :] == tail  # extra_args come last, after every rendered flag


def test_the_kv_cache_dtype_auto_is_vllms_default_and_not_rendered():
    args = list(render(ServingProfile.preset("l4", vllm={"kv_cache_dtype": "auto"})).template.containers[0].args)
    assert option(args, "--kv-cache-dtype") is None
    args = list(render(ServingProfile.preset("l4", vllm={"kv_cache_dtype": "fp8"})).template.containers[0].args)
    assert option(args, "--kv-cache-dtype") == "fp8"


def test_the_streamer_gets_its_threads_and_a_buffer_within_the_instance_and_no_eager_strategy():
    profile = ServingProfile.preset("l4", load_mode="runai-streamer")
    service = render_service(profile, TARGET, SOURCE, WEIGHTS, profile.image or "", revision="svc-rev")
    env = {e.name: e.value for e in service.template.containers[0].env}
    assert env["RUNAI_STREAMER_CONCURRENCY"] == "8"
    assert env["RUNAI_STREAMER_MEMORY_LIMIT"] == str(8 * 2**30)  # a quarter of the L4 preset's 32 GiB
    assert env["RUNAI_STREAMER_LOG_TO_STDERR"] == "1"  # its timing line, which cold-start reads
    assert "--safetensors-load-strategy" not in service.template.containers[0].args


def test_a_streamer_buffer_the_instance_cannot_hold_is_refused():
    from tasks.checks.preflight import check_streamer_memory

    too_big = ServingProfile.preset("l4", load_mode="runai-streamer", streamer_memory_gib=30)
    (finding,) = check_streamer_memory(too_big)
    assert finding.setting == "streamer_memory_gib" and "set streamer_memory_gib to 28 or less" in finding.message
    assert check_streamer_memory(ServingProfile.preset("l4", load_mode="runai-streamer")) == []


# A flag the user gives in extra_args replaces the rendered one --------------------------------------------------
def vllm_args(profile: ServingProfile) -> list[str]:
    return list(render(profile).template.containers[0].args)


def test_a_users_load_strategy_replaces_the_rendered_one_at_its_place():
    """vLLM's parser keeps the last of a repeated flag silently: rendered twice, the checks would read eager while
    prefetch ran (issue 34)."""
    rendered = vllm_args(ServingProfile.preset("rtx-pro-6000"))
    profile = ServingProfile.preset(
        "rtx-pro-6000", vllm={"extra_args": ["--safetensors-load-strategy", "prefetch", "--trust-remote-code"]}
    )
    args = vllm_args(profile)
    assert option(args, "--safetensors-load-strategy") == "prefetch"  # once (option asserts it), with the user's value
    place = rendered.index("--safetensors-load-strategy")
    assert args[: place + 2] == [*rendered[:place], "--safetensors-load-strategy", "prefetch"]
    assert args[place + 2 :] == [*rendered[place + 2 :], "--trust-remote-code"]  # the others follow, unchanged


@pytest.mark.parametrize(
    "extra",
    [["--safetensors-load-strategy=prefetch"], ["--safetensors_load_strategy", "prefetch"]],
    ids=["equals", "underscores"],
)
def test_a_users_flag_in_another_spelling_replaces_the_rendered_one(extra):
    args = vllm_args(ServingProfile.preset("rtx-pro-6000", vllm={"extra_args": extra}))
    assert not [a for a in args if a.startswith("--safetensors-load-strategy") and a not in extra]
    assert [a for a in args if "load" in a and "strategy" in a] == extra[:1]
    assert args[-1] == "--enable-chunked-prefill"  # replaced at its place, not appended


def test_the_load_strategy_the_checks_read_is_the_one_that_runs():
    profile = ServingProfile.preset(
        "rtx-pro-6000",
        vllm={"safetensors_load_strategy": "lazy", "extra_args": ["--safetensors-load-strategy", "prefetch"]},
    )
    assert running_value(profile, "--safetensors-load-strategy") == "prefetch"
    assert running_value(ServingProfile.preset("rtx-pro-6000"), "--safetensors-load-strategy") == "eager"
