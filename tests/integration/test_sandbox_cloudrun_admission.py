"""Cloud Run stand-in admission: each rule Cloud Run enforces, through the real run_v2 REST client."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator

import pytest
import yaml
from google.api_core import exceptions
from google.cloud import run_v2

from blocks import ModelSource, ServingProfile
from blocks.hardware import MODEL_GARDEN_VLLM_IMAGE
from blocks.profile import PRESETS
from flows.promote import _serving_profile
from flows.sync_deployments import ROOT
from tasks.checks.preflight import check_container_sizes
from tasks.common import clients
from tasks.deploy.render import Weights, render_service
from tests.support.models import tiny_model_files, upload_model
from tests.support.sandbox_config import sandbox_settings
from tests.support.services import gpu_service, health_probe, vllm_args

# A preview GPU: admitted only on a service that declares launch stage BETA (see the launch stage tests below).
RTX = {"gpu": "nvidia-rtx-pro-6000", "cpu": "20", "memory": "80Gi", "launch_stage": "BETA"}

_ids = itertools.count()


@pytest.fixture(scope="module")
def services(sandbox_target) -> run_v2.ServicesClient:
    return clients.run_services(sandbox_target)


def create(services, target, service: run_v2.Service, service_id: str | None = None, region: str | None = None):
    parent = f"projects/{target.project}/locations/{region or target.region}"
    return services.create_service(
        request=run_v2.CreateServiceRequest(
            parent=parent,
            service=service,
            service_id=service_id or f"adm-{next(_ids)}",
            validate_only=True,
        )
    ).result(polling=clients.operation_polling(target))


def rejected(services, target, service: run_v2.Service, **kwargs) -> str:
    with pytest.raises(exceptions.BadRequest) as caught:
        create(services, target, service, **kwargs)
    return caught.value.message


def test_a_correct_gpu_service_is_admitted(services, sandbox_target):
    result = create(services, sandbox_target, gpu_service("weights"))
    assert result.template.node_selector.accelerator == "nvidia-l4"


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            {"mount_path": "/dev/shm"},
            "Mount paths [/dev/shm] are in one of disallowed mount points [/dev, /proc, /sys]",
        ),
        ({"mount_path": "/proc/models"}, "Mount paths [/proc/models] are in one of disallowed mount points"),
        (
            {"max_instances": 4},
            "Max instances must be set to 3 or fewer in order to set GPU requirements.\nQuota "
            "violated:\nNvidiaL4GpuAllocNoZonalRedundancyPerProjectRegion requested: 4 allowed: 3",
        ),
        ({"max_instances": 0}, "Max instances must be set to 3 or fewer in order to set GPU requirements."),
        ({"zonal_redundancy_disabled": False}, "You do not have quota for using GPUs with zonal redundancy."),
        (  # the L4's own minimums, on the container holding it
            {"cpu": "2", "memory": "8Gi"},
            "spec.template.spec.containers[0].resources.limits: CPU must be at least 4; memory must be at least 16Gi",
        ),
        ({"memory": "8Gi"}, "spec.template.spec.containers[0].resources.limits: memory must be at least 16Gi"),
        (  # whole vCPUs of 1, 2, 4, 6 or 8 only
            {"cpu": "7", "memory": "28Gi"},
            "spec.template.spec.containers[0].resources.limits.cpu: Invalid value specified for container cpu. Must "
            "be equal to one of [.08-1], 1.0, 2.0, 4.0, 6.0, 8.0",
        ),
        (
            {"memory": "40Gi"},
            "spec.template.spec.containers[0].resources.limits.memory: Invalid value specified for container "
            "memory. For 8.0 CPU, memory must be between 4Gi and 32Gi inclusive.",
        ),
        ({"cpu_idle": True}, "GPU services require CPU to be always allocated"),
        ({"gpu": "nvidia-a100"}, "accelerator 'nvidia-a100' is not supported"),
        ({"env": {"PORT": "8000"}}, "The following reserved env names were provided: PORT"),
        ({"image": "docker.io/library/nonexistent:1"}, "Image 'docker.io/library/nonexistent:1' not found"),
        ({"probe": health_probe(period=10, threshold=181)}, "failureThreshold x periodSeconds = 181 x 10 = 1810"),
        ({"revision": "other-00001-abc"}, "must be prefixed by the service name"),
    ],
)
def test_cloud_run_rejects_what_it_rejects(services, sandbox_target, change, expected):
    message = rejected(services, sandbox_target, gpu_service("weights", **change), service_id="svc-admission")
    assert expected in message


@pytest.fixture
def room_for_an_rtx(sb) -> Iterator[None]:
    """vCPU and memory quotas raised to hold RTX PRO 6000 instances (20 vCPU, 80 GiB each), the GPU quota left as a
    new project's: for tests of the RTX's own rules. A new project's 40 GiB refuses any RTX instance
    (test_memory_quota_message_matches_cloud_run)."""
    with sandbox_settings(sb, cpu_quota=40, memory_quota_gib=160):
        yield


@pytest.mark.usefixtures("room_for_an_rtx")
def test_rtx_pro_6000_needs_its_minimums_and_a_region_that_has_it(services, sandbox_target):
    rtx = RTX
    assert create(services, sandbox_target, gpu_service("w", **rtx)).template.node_selector.accelerator
    message = rejected(services, sandbox_target, gpu_service("w", **{**rtx, "cpu": "8"}))
    assert "limits.cpu: Invalid value specified for container cpu. Must be equal to one of 20.0, 22.0" in message
    # RTX quota is 1 in the sandbox project, as seen in the field.
    assert "Max instances must be set to 1 or fewer" in rejected(
        services, sandbox_target, gpu_service("w", **rtx, max_instances=2)
    )
    message = rejected(services, sandbox_target, gpu_service("w", **rtx), region="europe-west1")
    assert "not available in region 'europe-west1'" in message


@pytest.mark.usefixtures("room_for_an_rtx")
def test_rtx_pro_6000_needs_gpu_zonal_redundancy_disabled(services, sandbox_target):
    redundant = gpu_service("w", **RTX, zonal_redundancy_disabled=False)
    message = rejected(services, sandbox_target, redundant, region="europe-west4")
    assert "You do not have quota for using GPUs with zonal redundancy." in message
    admitted = create(services, sandbox_target, gpu_service("w", **RTX), region="europe-west4")
    assert admitted.template.gpu_zonal_redundancy_disabled


def test_rtx_pro_6000_memory_below_80gi_is_refused(services, sandbox_target):
    message = rejected(services, sandbox_target, gpu_service("w", **{**RTX, "memory": "64Gi"}))
    assert "For 20.0 CPU, memory must be between 80Gi and 80Gi inclusive." in message


def test_l4_in_a_region_without_l4_is_refused(services, sandbox_target):
    message = rejected(services, sandbox_target, gpu_service("w"), region="asia-south2")
    assert "GPU type 'nvidia-l4' is not available in region 'asia-south2'" in message


@pytest.mark.usefixtures("grants_propagated")  # the weights bucket is granted raw right before the deploy
def test_reusing_a_revision_name_with_another_configuration_is_refused(sb, services, sandbox_target):
    sb.run("POST", "/idle")  # what earlier tests left idle holds nothing: Cloud Run's idle time has passed
    bucket, service_id = "admission-test-weights", f"adm-{next(_ids)}"
    upload_model(clients.storage(sandbox_target), bucket, "models/tiny", tiny_model_files())
    polling = clients.operation_polling(sandbox_target)
    first = services.create_service(
        parent=sandbox_target.location_path,
        service=gpu_service(bucket, revision=f"{service_id}-one"),
        service_id=service_id,
    ).result(timeout=60, polling=polling)
    try:
        changed = gpu_service(bucket, revision=f"{service_id}-one", args=vllm_args("--dtype=bfloat16"))
        with pytest.raises(exceptions.Conflict) as caught:
            services.update_service(service=run_v2.Service(changed, name=first.name)).result(polling=polling)
        assert caught.value.message.endswith(
            f": Revision named '{service_id}-one' with different configuration already exists."
        )
        after = services.get_service(name=first.name)
        assert after.latest_ready_revision == first.latest_ready_revision == f"{first.name}/revisions/{service_id}-one"
        assert [(t.revision, t.percent) for t in after.traffic_statuses] == [(f"{service_id}-one", 100)]
    finally:
        with contextlib.suppress(exceptions.NotFound):
            services.delete_service(name=first.name).result(polling=polling)


def test_cpu_service_without_gpu_is_admitted_and_probe_limit_is_600s(services, sandbox_target):
    cpu = gpu_service("w", gpu=None, cpu="4", memory="10Gi", max_instances=1, cpu_idle=True)
    assert create(services, sandbox_target, cpu).template.containers[0].resources.limits["cpu"] == "4"
    too_long = gpu_service("w", gpu=None, cpu="4", memory="10Gi", probe=health_probe(period=10, threshold=61))
    assert "above the maximum of 600 seconds" in rejected(services, sandbox_target, too_long)


def test_memory_quota_message_matches_cloud_run(sb, services, sandbox_target):
    """googlecodelabs/feedback#2311, word for word after the field path."""
    message = rejected(services, sandbox_target, gpu_service("w", **RTX))  # a new project's 40 GiB
    assert ": spec.template.metadata.annotations[autoscaling.knative.dev/maxScale]: Max instances" in message
    assert message.endswith(
        ": Max instances must be set to 0 or fewer to set the requested total memory.\nConsider running your "
        "workload in a region with greater capacity, or requesting an increase in quota for this region if you are "
        "seeing sustained usage near this limit, see https://cloud.google.com/run/quotas.\n\nQuota violated:\n"
        "MemAllocPerProjectRegion requested: 85899345920 allowed: 42949672960"
    )


def test_no_gpu_quota_is_refused_in_cloud_runs_words_with_where_to_request_it(sb, services, sandbox_target):
    """A project whose L4 quota without zonal redundancy is 0: gcloud run deploy's words (PrositAS/
    eskadra-bielik-misja1's README), the request link included, not the "Max instances must be set to 0" of a quota
    too small."""
    with sandbox_settings(sb, gpu_quota={**sb.configure()["gpu_quota"], "nvidia-l4": 0}):
        message = rejected(services, sandbox_target, gpu_service("w", max_instances=1))
    assert message.endswith(
        "spec.template.metadata.annotations[autoscaling.knative.dev/maxScale]: You do not have quota for using GPUs "
        "without zonal redundancy. Learn more about GPU zonal redundancy: g.co/cloudrun/gpu-redundancy-help\n\n"
        "To request quota: g.co/cloudrun/gpu-quota"
    )
    assert "Max instances must be set" not in message


def test_cpu_and_memory_both_short_are_both_named_and_the_smallest_fit_wins(sb, services, sandbox_target):
    """#1856: 3 instances of 20 vCPU / 80 GiB on 20 vCPU / 40 GiB: CPU would allow 1, memory 0."""
    before = sb.configure()
    with sandbox_settings(sb, gpu_quota={**before["gpu_quota"], "nvidia-rtx-pro-6000": 3}):  # 20 vCPU, 40 GiB: new
        message = rejected(services, sandbox_target, gpu_service("w", **{**RTX, "max_instances": 3}))
    assert "Max instances must be set to 0 or fewer to set the requested total CPU." in message
    assert message.endswith(
        "Quota violated:\nCpuAllocPerProjectRegion requested: 60000 allowed: 20000\n"
        "MemAllocPerProjectRegion requested: 257698037760 allowed: 42949672960"
    )


@pytest.mark.parametrize("service_id", ["Upper", "9starts-with-digit", "ends-with-dash-", "x" * 50])
def test_invalid_service_ids_are_refused(services, sandbox_target, service_id):
    message = rejected(services, sandbox_target, gpu_service("w"), service_id=service_id)
    assert "must use only lowercase alphanumeric characters and dashes" in message


def test_tag_plus_service_name_longer_than_46_characters_is_refused(services, sandbox_target):
    service = gpu_service(
        "w",
        traffic=[
            run_v2.TrafficTarget(
                type_=run_v2.TrafficTargetAllocationType.TRAFFIC_TARGET_ALLOCATION_TYPE_LATEST,
                percent=100,
                tag="candidate-revision-under-test",
            )
        ],
    )
    message = rejected(services, sandbox_target, service, service_id="a-rather-long-service-name")
    assert "exceed 46 characters" in message


def test_unknown_service_is_not_found_and_other_projects_are_forbidden(services, sandbox_target):
    with pytest.raises(exceptions.NotFound):
        services.get_service(name=f"{sandbox_target.location_path}/services/does-not-exist")
    with pytest.raises(exceptions.Forbidden):
        services.get_service(name="projects/someone-else/locations/us-central1/services/x")


def test_args_are_kept_verbatim(services, sandbox_target):
    args = vllm_args("--dtype=bfloat16")
    assert list(create(services, sandbox_target, gpu_service("w", args=args)).template.containers[0].args) == args


@pytest.mark.parametrize(
    ("option", "refused"),
    [
        ("enable-buffered-read=true", False),
        ("implicit-dirs", False),
        ("metadata-cache-ttl-secs=-1", False),
        ("enable-bufferd-read=true", True),  # misspelt: gcsfuse has no such flag
        ("--no-such-flag", True),
    ],
)
def test_mount_options_must_be_gcsfuse_flags(services, sandbox_target, option, refused):
    service = gpu_service("w")
    service.template.volumes[0].gcs.mount_options.append(option)
    if refused:
        message = rejected(services, sandbox_target, service)
        assert f"mountOptions: '{option}' is not a Cloud Storage FUSE flag" in message
    else:
        assert create(services, sandbox_target, service).template.volumes[0].gcs.mount_options[-1] == option


# Container sizes: what the product renders for every shipped model file and preset --------------------------------
DEPLOYMENTS = sorted(ROOT.glob("deployments/**/*.yaml"))
WEIGHTS = Weights("org/model", "a" * 40, "size-test-weights", f"model-cache/org/model/{'a' * 40}", 5 * 10**9)


def product_services(target) -> list[tuple[str, ServingProfile, run_v2.Service]]:
    """Each model file's service as a run renders it (flows/promote's profile: the file's profile, image or build and
    metrics), then each preset with and without the metrics sidecar."""
    profiles = [(str(path.relative_to(ROOT)), yaml.safe_load(path.read_text())) for path in DEPLOYMENTS]
    profiles = [(name, _serving_profile(spec, None, None, None, None)) for name, spec in profiles]
    profiles += [(f"{p}+{m}", ServingProfile.preset(p, metrics=m)) for p in PRESETS for m in ("none", "vllm")]
    rendered = []
    for name, profile in profiles:
        image = profile.image or MODEL_GARDEN_VLLM_IMAGE  # a built image's stand-in: sizes do not depend on it
        service = render_service(profile, target, ModelSource(repo_id="org/model"), WEIGHTS, image)
        # Sizes are under test: the serving account and the VPC the render names are other tests' (test_rollout).
        service.template.service_account = ""
        service.template.vpc_access = run_v2.VpcAccess()
        rendered.append((name, profile, service))
    return rendered


def test_every_shipped_model_file_and_preset_renders_sizes_the_sandbox_admits_or_preflight_refuses(
    sb, services, sandbox_target
):
    """A profile preflight passes is one Cloud Run admits; one it refuses (naming the fix), Cloud Run refuses too. On
    main the L4 preset with the sidecar rendered vLLM 7 vCPU / 31.5 GiB, which preflight passed and Cloud Run refuses.
    """
    assert DEPLOYMENTS, "no model files found"
    before = sb.configure()
    # Sizes alone: the RTX preset's 80 GiB exceed a new project's 40 GiB memory quota (doctor and preflight's quota
    # checks cover that), and its GPU quota may be 0.
    rtx_quota = {**before["gpu_quota"], "nvidia-rtx-pro-6000": 1}
    verdicts = {}
    with sandbox_settings(sb, memory_quota_gib=800, cpu_quota=200, gpu_quota=rtx_quota):
        for name, profile, service in product_services(sandbox_target):
            refused_by_preflight = [f.message for f in check_container_sizes(profile)]
            try:
                create(services, sandbox_target, service)
                verdicts[name] = (refused_by_preflight, None)
            except exceptions.BadRequest as caught:
                verdicts[name] = (refused_by_preflight, caught.message)
    disagreements = {name: v for name, v in verdicts.items() if bool(v[0]) != bool(v[1])}
    assert disagreements == {}
    refused = {name for name, (preflight, _) in verdicts.items() if preflight}
    assert refused == {"rtx-pro-6000+vllm"}  # 20 vCPU / 80 GiB are the RTX's own minimum: no room for the collector
    assert "Must be equal to one of 20.0, 22.0" in verdicts["rtx-pro-6000+vllm"][1]


def test_a_jobs_containers_get_the_same_sizes(sandbox_target):
    jobs = run_v2.JobsClient(
        transport="rest",
        credentials=clients.credentials(sandbox_target),
        client_options=clients.client_options(sandbox_target, "run"),
    )

    def job(cpu: str, memory: str) -> run_v2.CreateJobRequest:
        limits = {"cpu": cpu, "memory": memory}
        container = run_v2.Container(
            image=MODEL_GARDEN_VLLM_IMAGE, resources=run_v2.ResourceRequirements(limits=limits)
        )
        template = run_v2.ExecutionTemplate(template=run_v2.TaskTemplate(containers=[container]))
        return run_v2.CreateJobRequest(
            parent=sandbox_target.location_path, job=run_v2.Job(template=template), job_id=f"size-{next(_ids)}",
            validate_only=True,
        )  # fmt: skip

    polling = clients.operation_polling(sandbox_target)
    for cpu, memory in (("2", "4Gi"), ("4", "4Gi"), ("8", "4Gi")):  # the work pool's staging job sizes
        jobs.create_job(request=job(cpu, memory)).result(polling=polling)
    with pytest.raises(exceptions.BadRequest) as caught:
        jobs.create_job(request=job("3", "4Gi")).result(polling=polling)
    assert "containers[0].resources.limits.cpu: Invalid value specified for container cpu." in caught.value.message
    with pytest.raises(exceptions.BadRequest) as caught:
        jobs.create_job(request=job("1", "256Mi")).result(polling=polling)
    assert "For 1.0 CPU, memory must be between 512Mi and 4Gi inclusive." in caught.value.message
