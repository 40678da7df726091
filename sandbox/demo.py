"""A guided tour of the sandbox: a model goes from the Hub stand-in to a serving Cloud Run revision, offline.

Until the promote-model flow exists this is the project's main job. Every step uses the real client
libraries (huggingface_hub, google-cloud-storage, google-cloud-run) through ``tasks.clients`` against the
stand-ins, exactly as the product will against GCP; then it replays two field failures from seed 000.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import httpx
from google.api_core import exceptions
from google.cloud import run_v2
from google.protobuf import duration_pb2
from pydantic import SecretStr

from blocks import GcpTarget, ModelSource, ServingProfile
from sandbox.handle import SandboxHandle
from tasks import clients

DEMO_REPO = "sandbox/tiny-chat"
SERVICE_ID = "tiny-chat"


def _step(text: str) -> None:
    print(f"\n==> {text}", flush=True)


def _service(target: GcpTarget, profile: ServingProfile, image: str, model_dir: str, served: str) -> run_v2.Service:
    """A GPU service shaped like seed 000's working deploy, with the weights on a Cloud Storage volume."""
    args = [
        "vllm", "serve", f"{profile.mount_path}/{model_dir}", "--served-model-name", served,
        f"--port={profile.container_port}", "--host=0.0.0.0", "--enforce-eager",
        f"--max-num-seqs={profile.vllm.max_num_seqs}",
    ]  # fmt: skip
    container = run_v2.Container(
        image=image,
        args=args,
        env=[run_v2.EnvVar(name="HF_HUB_OFFLINE", value="1")],
        resources=run_v2.ResourceRequirements(
            limits={"cpu": str(profile.cpu), "memory": f"{profile.memory_gib}Gi", "nvidia.com/gpu": "1"},
            cpu_idle=False,
        ),
        ports=[run_v2.ContainerPort(name="http1", container_port=profile.container_port)],
        startup_probe=run_v2.Probe(
            http_get=run_v2.HTTPGetAction(path="/health", port=profile.container_port),
            initial_delay_seconds=5,
            period_seconds=2,
            timeout_seconds=2,
            failure_threshold=120,
        ),
        volume_mounts=[run_v2.VolumeMount(name="models", mount_path=profile.mount_path)],
    )
    assert profile.gpu_type is not None
    return run_v2.Service(
        template=run_v2.RevisionTemplate(
            containers=[container],
            volumes=[
                run_v2.Volume(
                    name="models",
                    gcs=run_v2.GCSVolumeSource(
                        bucket=target.bucket_name, read_only=True, mount_options=[f"only-dir={target.model_prefix}"]
                    ),
                )
            ],
            node_selector=run_v2.NodeSelector(accelerator=profile.gpu_type),
            gpu_zonal_redundancy_disabled=not profile.gpu_zonal_redundancy,
            scaling=run_v2.RevisionScaling(max_instance_count=profile.max_instances),
            max_instance_request_concurrency=profile.effective_concurrency,
            timeout=duration_pb2.Duration(seconds=profile.request_timeout_seconds),
        )
    )


def _stage(target: GcpTarget, source: ModelSource, token: SecretStr) -> tuple[str, int]:
    """Download the repo at its resolved commit and copy it into the bucket (the seeds' two-step way)."""
    from huggingface_hub import snapshot_download

    api = clients.hub(source, token).api()
    sha = api.model_info(source.repo_id, revision=source.revision).sha
    storage = clients.storage(target)
    bucket = storage.bucket(target.bucket_name)
    if not bucket.exists():
        storage.create_bucket(target.bucket_name, location=target.region)
    total = 0
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(
            snapshot_download(
                source.repo_id,
                revision=sha,
                endpoint=source.hub_endpoint,
                token=token.get_secret_value(),
                local_dir=tmp,
                allow_patterns=["*.json", "*.safetensors", "*.jinja"],
            )
        )
        for path in sorted(p for p in folder.rglob("*") if p.is_file() and ".cache" not in p.parts):
            rel = path.relative_to(folder).as_posix()
            bucket.blob(f"{target.model_prefix}/{source.repo_id}/{sha}/{rel}").upload_from_filename(path)
            total += path.stat().st_size
    return sha, total


def run_demo(state_dir: Path) -> int:
    from huggingface_hub.utils import disable_progress_bars

    disable_progress_bars()
    started = time.monotonic()
    _step("Starting the sandbox (Hub, GCS emulator, Cloud Run control plane) on loopback")
    with SandboxHandle.start(state_dir) as sandbox:
        target = GcpTarget.model_validate(sandbox.target)
        source = ModelSource(repo_id=DEMO_REPO, hub_endpoint=sandbox.hub_url)
        profile = ServingProfile.preset("l4")
        token = SecretStr(sandbox.hub_token)
        print(f"    control plane {sandbox.control_url}, Hub {sandbox.hub_url}, GCS {sandbox.gcs_url}")

        _step(f"Staging {source.repo_id}@{source.revision} into gs://{target.bucket_name}/{target.model_prefix}/")
        sha, total = _stage(target, source, token)
        print(f"    commit {sha[:12]}, {total / 1e6:.1f} MB staged")

        _step(f"Deploying Cloud Run service '{SERVICE_ID}' on an {profile.gpu_type} (Model Garden image, eager)")
        services = clients.run_services(target)
        model_dir = f"{source.repo_id}/{sha}"
        service = services.create_service(
            parent=target.location_path,
            service=_service(target, profile, profile.image or "", model_dir, source.served_model_name),
            service_id=SERVICE_ID,
        ).result(timeout=120, polling=clients.operation_polling(target))
        print(f"    revision {service.latest_ready_revision.rsplit('/', 1)[1]} is ready at {service.uri}")

        _step("Asking the model a question through the private service URL (with a bearer token)")
        refused = httpx.get(f"{service.uri}/v1/models", timeout=30)
        print(f"    without a token: HTTP {refused.status_code} (the service is private)")
        answer = httpx.post(
            f"{service.uri}/v1/chat/completions",
            headers={"Authorization": "Bearer sandbox-identity-token"},
            json={
                "model": source.served_model_name,
                "messages": [{"role": "user", "content": "Introduce yourself in one sentence."}],
                "max_tokens": 32,
            },
            timeout=60,
        ).json()
        print(f"    answer: {answer['choices'][0]['message']['content']!r}")
        print(f"    usage:  {answer['usage']}")

        _step("Replaying seed 000: the generic vllm/vllm-openai image on an L4")
        generic = _service(target, profile, "vllm/vllm-openai:latest", model_dir, source.served_model_name)
        generic.template.containers[0].args = list(generic.template.containers[0].args)[2:]
        try:
            services.update_service(service=run_v2.Service(generic, name=service.name)).result(
                timeout=120, polling=clients.operation_polling(target)
            )
        except exceptions.GoogleAPICallError as exc:
            print(f"    rejected as in the field: {exc.message.splitlines()[0][:150]}...")
            log = httpx.get(f"{sandbox.control_url}/_sandbox/run/logs/{_latest_revision(services, service.name)}")
            line = next((ln for ln in log.text.splitlines() if "driver" in ln), "")
            print(f"    container log: {line[:150]}")
        still = services.get_service(name=service.name)
        print(f"    traffic stays on {still.traffic_statuses[0].revision} ({still.traffic_statuses[0].percent}%)")

        _step("Tearing down the service (idle GPUs cost money)")
        services.delete_service(name=service.name).result(timeout=60, polling=clients.operation_polling(target))
        print(f"    deleted; whole tour took {time.monotonic() - started:.1f} s")
    print("\nNext: `make test` runs the suite; `make sandbox` keeps a sandbox up for your own experiments.")
    return 0


def _latest_revision(services, service_name: str) -> str:
    return services.get_service(name=service_name).latest_created_revision.rsplit("/", 1)[1]
