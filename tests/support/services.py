"""Cloud Run v2 Service messages for sandbox tests, shaped like seed 000's working GPU deploy."""

from __future__ import annotations

from google.cloud import run_v2
from google.protobuf import duration_pb2

MODEL_GARDEN = "us-docker.pkg.dev/vertex-ai/vertex-vision-model-garden-dockers/pytorch-vllm-serve:gemma4"
MODEL_DIR = "/mnt/models/tiny"
SERVED_NAME = "sandbox/tiny"
# The smallest L4 instance Cloud Run runs: the GPU's container needs at least 4 vCPU / 16 GiB ("CPU must be at least
# 4; memory must be at least 16Gi", sandbox/control/run/validation.py). Two such instances fit a new project's
# 20 vCPU / 40 GiB side by side (a serving revision and the next one, two services), where two of gpu_service's
# 8 vCPU / 32 GiB do not: ``gpu_service(bucket, **SMALLEST_L4)``.
SMALLEST_L4 = {"cpu": "4", "memory": "16Gi"}


def vllm_args(*extra: str, model: str = MODEL_DIR, eager: bool = True, port: int = 8080) -> list[str]:
    args = ["vllm", "serve", model, "--served-model-name", SERVED_NAME, f"--port={port}", "--host=0.0.0.0"]
    if eager:
        args.append("--enforce-eager")
    return [*args, "--max-num-seqs=8", *extra]


def health_probe(period: int = 2, threshold: int = 120, initial: int = 5) -> run_v2.Probe:
    return run_v2.Probe(
        http_get=run_v2.HTTPGetAction(path="/health", port=8080),
        initial_delay_seconds=initial,
        period_seconds=period,
        timeout_seconds=2,
        failure_threshold=threshold,
    )


def gpu_service(
    bucket: str,
    *,
    args: list[str] | None = None,
    image: str = MODEL_GARDEN,
    gpu: str | None = "nvidia-l4",
    cpu: str = "8",
    memory: str = "32Gi",
    max_instances: int = 1,
    zonal_redundancy_disabled: bool = True,
    cpu_idle: bool = False,
    probe: run_v2.Probe | None = None,
    liveness: run_v2.Probe | None = None,
    mount_path: str = "/mnt/models",
    only_dir: str = "models",
    env: dict[str, str] | None = None,
    revision: str = "",
    traffic: list[run_v2.TrafficTarget] | None = None,
    launch_stage: str = "",
) -> run_v2.Service:
    limits = {"cpu": cpu, "memory": memory}
    if gpu:
        limits["nvidia.com/gpu"] = "1"
    template = run_v2.RevisionTemplate(
        revision=revision,
        containers=[
            run_v2.Container(
                image=image,
                args=args if args is not None else vllm_args(),
                env=[run_v2.EnvVar(name=k, value=v) for k, v in (env or {}).items()],
                resources=run_v2.ResourceRequirements(limits=limits, cpu_idle=cpu_idle, startup_cpu_boost=True),
                ports=[run_v2.ContainerPort(name="http1", container_port=8080)],
                startup_probe=probe or health_probe(),
                liveness_probe=liveness,
                volume_mounts=[run_v2.VolumeMount(name="models", mount_path=mount_path)],
            )
        ],
        volumes=[
            run_v2.Volume(
                name="models",
                gcs=run_v2.GCSVolumeSource(bucket=bucket, read_only=True, mount_options=[f"only-dir={only_dir}"]),
            )
        ],
        scaling=run_v2.RevisionScaling(min_instance_count=0, max_instance_count=max_instances),
        max_instance_request_concurrency=16,
        timeout=duration_pb2.Duration(seconds=600),
        execution_environment=run_v2.ExecutionEnvironment.EXECUTION_ENVIRONMENT_GEN2,
    )
    if gpu:
        template.node_selector = run_v2.NodeSelector(accelerator=gpu)
        template.gpu_zonal_redundancy_disabled = zonal_redundancy_disabled
    return run_v2.Service(
        template=template,
        ingress=run_v2.IngressTraffic.INGRESS_TRAFFIC_ALL,
        traffic=traffic or [],
        launch_stage=launch_stage or "LAUNCH_STAGE_UNSPECIFIED",
    )
