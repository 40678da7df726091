"""Cloud Run's admission checks on a Service and its revision template, with Cloud Run's messages.

Pure functions over run_v2 messages. Facts from FACTS.md (Cloud Run paragraph) and seed 000; where Google's
exact wording is known it is used verbatim (disallowed mount points, GPU max instances, zonal redundancy
quota, total memory), elsewhere the message follows the API's "field: problem" style.

Several containers (sidecars; run.v2 ``Container.dependsOn``, Cloud Run docs "Deploying multiple containers"): the
ingress container is the one with ``ports`` ("A Cloud Run instance always has one single ingress container that
listens for requests, and optionally one or more sidecar containers", container contract). Rules and their sources:
- exactly one container declares a port: "template.containers: Revision template should contain exactly one
  container with an exposed port." (the v2 API's 400, verbatim in GoogleCloudPlatform/terraform-google-cloud-run
  issues 302 and 488); so a sidecar with ``ports`` is refused with it too;
- at most 10 containers per instance (Google's launch material as quoted by einride/cloudrunner-go PR 650 "up to 10
  per instance"; the API's wording for it is unconfirmed);
- names follow RFC 1123 ("Invalid container name ''. Must conform to RFC 1123: ...", the API's words in
  hashicorp/terraform-provider-google issue 21035); a container Cloud Run names itself (no name given) cannot
  declare dependencies: its dependency map would be keyed "" (the same issue), which the API refuses with that text;
  names are unique (wording ours);
- ``dependsOn`` names another container of the revision, no container depends on itself, and the dependencies form
  no cycle (wording ours: the API's texts are not public); a sidecar that others depend on has a startup probe:
  "spec.template.spec.containers[0].depends_on: Dependent container 'sidecar' must have startup probe specified"
  (gcloud's error quoted in GoogleCloudPlatform/cloud-run-samples issue 230, fixed by giving the sidecar one in
  commit f5d1e8f). The field is spelled ``depends_on`` in all of them, as in that real message. The ingress
  container always has one (Cloud Run's default TCP probe, resources.py), so depending on it needs none.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from google.api import launch_stage_pb2
from google.cloud import run_v2

from sandbox.config import SandboxConfig
from sandbox.control.errors import GoogleApiError, invalid_argument
from sandbox.control.serviceusage.catalog import gpu_quota_id


@dataclass(frozen=True)
class GpuType:
    min_cpu: float
    min_memory_gib: float
    regions: frozenset[str]
    preview: bool = False
    """A Pre-GA feature: the Service must declare launch stage BETA (or ALPHA) to use it."""


GPU_TYPES = {
    # L4 on services is GA since 2025-04-07 (Cloud Run release notes; magic-modules PR 13483 "The GPU feature no
    # longer requires beta launch stage").
    "nvidia-l4": GpuType(
        4, 16, frozenset({"asia-southeast1", "asia-south1", "europe-west1", "europe-west4", "us-central1", "us-east4"})
    ),
    # Cloud Run docs, "GPU support for services": "Preview — NVIDIA RTX PRO 6000 Blackwell GPU"; seed 004 deploys it
    # with `gcloud beta run deploy`.
    "nvidia-rtx-pro-6000": GpuType(
        20, 80, frozenset({"asia-southeast1", "asia-south2", "europe-west4", "us-central1"}), preview=True
    ),
}
# Launch stages that may use a BETA (preview) feature: BETA itself and the less stable ALPHA (run.v2 discovery:
# "Set the launch stage to a preview stage on input to allow use of preview features in that stage").
PREVIEW_STAGES = {launch_stage_pb2.LaunchStage.BETA, launch_stage_pb2.LaunchStage.ALPHA}


def launch_stage_error(feature: str, service_id: str) -> GoogleApiError:
    """Cloud Run's refusal of a preview feature on a GA service, word for word as gcloud, Terraform and Pulumi users
    report it (google-github-actions/deploy-cloudrun issues 26 and 35, pulumi/pulumi-gcp issue 1040,
    google/exposure-notifications-verification-server issue 1781: "googleapi: Error 400: The feature ..."). The
    v2 API answers 400 with status FAILED_PRECONDITION (terraform-provider-google issue 14010: "Error 400:
    Precondition check failed." for a v2 resource without launch_stage BETA). Unconfirmed: whether the v2 message
    carries the feature text above or only "Precondition check failed." as in that issue; the sandbox gives the
    feature text, and the product keys on no part of it (it renders launch_stage from the profile instead)."""
    return GoogleApiError(
        400,
        f"The feature '{feature}' is not supported in the declared launch stage on resource {service_id}. The "
        "launch stage annotation should be specified at least as BETA. Please visit "
        "https://cloud.google.com/run/docs/troubleshooting#launch-stage-validation for in-depth troubleshooting "
        "documentation.",
        "FAILED_PRECONDITION",
    )


GPU_LIMIT_KEY = "nvidia.com/gpu"
DISALLOWED_MOUNT_ROOTS = ("/dev", "/proc", "/sys")
DEFAULT_MAX_INSTANCES = 100
MAX_CONCURRENCY = 1000
MAX_REQUEST_TIMEOUT_S = 3600
PROBE_LIMIT_S, GPU_PROBE_LIMIT_S = 600, 1800
# A liveness probe's initial delay, period and timeout: at most 3600 s (run.v2 discovery document, Probe).
LIVENESS_LIMIT_S = 3600
SERVICE_ID = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
TAG = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
RESERVED_ENV = {"PORT", "K_SERVICE", "K_REVISION", "K_CONFIGURATION"}
MAX_CONTAINERS = 10
CONTAINER_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?$")
NAME_RULE = (
    "Must conform to RFC 1123: only lowercase letters, digits, hyphens, and periods are allowed, must begin and end "
    "with a letter or digit, and be less than 64 characters"
)
# Cloud Run's defaults for a container without limits (resources.with_defaults; Cloud Run docs, "Configure CPU
# limits" and "Configure memory limits": 1 vCPU, 512 MiB), in the form the API stores them.
DEFAULT_CPU, DEFAULT_MEMORY = "1000m", "512Mi"
QUANTITY = re.compile(r"^(\d+(?:\.\d+)?)(m|Ki|Mi|Gi|Ti|k|M|G|T)?$")
UNITS = {
    None: 1,
    "m": 1e-3,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
}


def has_field(message, name: str) -> bool:
    """Whether a message field was set (the REST client omits fields equal to their zero value)."""
    return type(message).pb(message).HasField(name)


def parse_quantity(value: str, field: str) -> float:
    match = QUANTITY.match(value.strip())
    if not match:
        raise invalid_argument(f"{field}: quantity '{value}' is not valid; use e.g. '8' or '32Gi'")
    return float(match.group(1)) * UNITS[match.group(2)]


def check_service_id(service_id: str) -> None:
    if not service_id:
        raise invalid_argument("service_id: required")
    if len(service_id) >= 50 or not SERVICE_ID.match(service_id):
        raise invalid_argument(
            f"service_id '{service_id}': must use only lowercase alphanumeric characters and dashes, "
            "cannot begin or end with a dash, must begin with a letter and be less than 50 characters"
        )


def check_revision_name(service_id: str, revision: str) -> None:
    if not revision:
        return
    if not revision.startswith(f"{service_id}-"):
        raise invalid_argument(
            f"spec.template.revision: revision name '{revision}' must be prefixed by the service name '{service_id}-'"
        )
    if len(revision) > 63 or not SERVICE_ID.match(revision):
        raise invalid_argument(
            f"spec.template.revision: '{revision}' must be a DNS label of at most 63 lowercase alphanumeric "
            "characters or dashes, starting with a letter"
        )


def check_tag(service_id: str, tag: str) -> None:
    if not TAG.match(tag):
        raise invalid_argument(
            f"spec.traffic.tag: '{tag}' must use only lowercase alphanumeric characters and dashes, "
            "begin with a letter and not end with a dash"
        )
    if len(tag) + len(service_id) > 46:
        raise invalid_argument(
            f"spec.traffic.tag: the tag '{tag}' and the service name '{service_id}' together exceed "
            "46 characters; use a shorter tag"
        )


def gpu_type_of(template: run_v2.RevisionTemplate) -> str | None:
    return template.node_selector.accelerator or None


def max_instances_of(service: run_v2.Service) -> int:
    """Effective max instances: the smaller of the service-level and revision-level settings; 0 when neither is set."""
    candidates = [c for c in (service.scaling.max_instance_count, service.template.scaling.max_instance_count) if c]
    return min(candidates) if candidates else 0


def default_max_instances(cpu: float, memory_gib: float, config: SandboxConfig) -> int:
    """Max instances of a CPU service when none is set: Cloud Run takes the lowest of what the region's quotas hold of
    one instance ("About maximum instances"; google/oss-rebuild PR 1605: "Without a scaling block Cloud Run caps the
    service at the default 20 instances"), and never above its default of 100. At least one: an instance no quota
    holds is refused as with a maximum of 1."""
    fits = [DEFAULT_MAX_INSTANCES, math.floor(config.cpu_quota / cpu), math.floor(config.memory_quota_gib / memory_gib)]
    return max(min(fits), 1)


def cpu_idle_effective(resources: run_v2.ResourceRequirements, has_resources: bool) -> bool:
    """cpu_idle defaults to true, but once resources are set an omitted cpu_idle reads false (API docs)."""
    return bool(resources.cpu_idle) if has_resources else True


@functools.cache
def gcsfuse_flags() -> frozenset[str]:
    """The flags of gcsfuse's own list (gcsfuse_flags.txt: cfg/params.yaml at v3.11.2, its header says where)."""
    lines = (Path(__file__).with_name("gcsfuse_flags.txt")).read_text().splitlines()
    return frozenset(line.strip() for line in lines if line.strip() and not line.startswith("#"))


def _check_mount_options(volume: run_v2.Volume) -> None:
    """Each mount option is a gcsfuse flag (``name`` or ``name=value``): Cloud Run passes them to gcsfuse ("A list of
    additional flags to pass to the gcsfuse CLI", the v2 API reference). Which flags Cloud Run itself refuses or
    which gcsfuse version it runs is not documented (the stored page was cut before any list): the check is
    gcsfuse's own flag list, and the wording of the refusal is the sandbox's."""
    for option in volume.gcs.mount_options:
        name = option.split("=", 1)[0].strip().lstrip("-")
        if name not in gcsfuse_flags():
            raise invalid_argument(
                f"spec.template.spec.volumes[{volume.name}].csi.volumeAttributes.mountOptions: '{option}' is not a "
                "Cloud Storage FUSE flag"
            )


def check_service(service: run_v2.Service, service_id: str, region: str, config: SandboxConfig) -> None:
    """Raise a 400 GoogleApiError naming the first problem, as the Cloud Run API would."""
    template = service.template
    check_revision_name(service_id, template.revision)
    containers = list(template.containers)
    if not containers:
        raise invalid_argument("spec.template.spec.containers: at least one container is required")
    _check_container_set(containers)
    volume_names = {v.name for v in template.volumes}
    for volume in template.volumes:
        if has_field(volume, "gcs") and not volume.gcs.bucket:
            raise invalid_argument(f"spec.template.spec.volumes[{volume.name}].csi.bucket: required")
        if has_field(volume, "gcs"):
            _check_mount_options(volume)
    for index, container in enumerate(containers):
        _check_container(index, container, volume_names)
    accelerator = gpu_type_of(template)
    gen2 = template.execution_environment == run_v2.ExecutionEnvironment.EXECUTION_ENVIRONMENT_GEN2
    check_container_sizes(containers, "spec.template.spec.containers", accelerator, gen2 or bool(accelerator))
    if accelerator in GPU_TYPES and GPU_TYPES[accelerator].preview and service.launch_stage not in PREVIEW_STAGES:
        raise launch_stage_error(f"GPU type {accelerator}", service_id)
    _check_gpu_and_capacity(service, region, config)
    if template.max_instance_request_concurrency > MAX_CONCURRENCY:
        raise invalid_argument(
            f"spec.template.spec.containerConcurrency: {template.max_instance_request_concurrency} is above "
            f"the maximum of {MAX_CONCURRENCY}"
        )
    if template.timeout and template.timeout.total_seconds() > MAX_REQUEST_TIMEOUT_S:
        raise invalid_argument(
            f"spec.template.spec.timeoutSeconds: {int(template.timeout.total_seconds())} is above the maximum "
            f"of {MAX_REQUEST_TIMEOUT_S} seconds"
        )
    for scaling in (template.scaling, service.scaling):
        if scaling.min_instance_count < 0 or scaling.max_instance_count < 0:
            raise invalid_argument("scaling: instance counts must not be negative")
        if scaling.max_instance_count and scaling.min_instance_count > scaling.max_instance_count:
            raise invalid_argument(
                "spec.template.metadata.annotations[autoscaling.knative.dev/minScale]: min instances "
                f"({scaling.min_instance_count}) must not exceed max instances ({scaling.max_instance_count})"
            )
    for target in service.traffic:
        if target.tag:
            check_tag(service_id, target.tag)


def ingress_index(containers: list[run_v2.Container]) -> int:
    """The ingress container's index: the one that declares a port, else the only (first) one."""
    return next((i for i, c in enumerate(containers) if c.ports), 0)


def _check_container_set(containers: list[run_v2.Container]) -> None:
    """Cloud Run's rules for several containers in one instance (module docstring)."""
    if len(containers) > MAX_CONTAINERS:
        raise invalid_argument(
            f"spec.template.spec.containers: at most {MAX_CONTAINERS} containers are allowed per instance, "
            f"got {len(containers)}"
        )
    if len(containers) > 1 and sum(1 for c in containers if c.ports) != 1:
        raise invalid_argument(
            "template.containers: Revision template should contain exactly one container with an exposed port."
        )
    by_name: dict[str, int] = {}
    for index, container in enumerate(containers):
        prefix = f"spec.template.spec.containers[{index}]"
        if container.name and not CONTAINER_NAME.match(container.name):
            raise invalid_argument(f"{prefix}.name: Invalid container name '{container.name}'. {NAME_RULE}")
        if container.name in by_name:
            raise invalid_argument(
                f"{prefix}.name: container name '{container.name}' is already used by "
                f"spec.template.spec.containers[{by_name[container.name]}]; names must be unique within a revision"
            )
        if container.name:
            by_name[container.name] = index
    ingress = ingress_index(containers)
    for index, container in enumerate(containers):
        field = f"spec.template.spec.containers[{index}].depends_on"
        if container.depends_on and not container.name:
            raise invalid_argument(f"{field}: Invalid container name ''. {NAME_RULE}")
        for dependency in container.depends_on:
            if dependency == container.name:
                raise invalid_argument(f"{field}: container '{dependency}' cannot depend on itself")
            if dependency not in by_name:
                known = ", ".join(f"'{n}'" for n in by_name if n != container.name) or "none"
                raise invalid_argument(
                    f"{field}: container '{dependency}' not found in the revision template (other containers: {known})"
                )
            target = by_name[dependency]
            if target != ingress and not has_field(containers[target], "startup_probe"):
                raise invalid_argument(f"{field}: Dependent container '{dependency}' must have startup probe specified")
    cycle = _dependency_cycle(containers, by_name)
    if cycle:
        raise invalid_argument(
            f"spec.template.spec.containers[{by_name[cycle[0]]}].depends_on: container dependencies form a cycle: "
            + " -> ".join(cycle)
        )


def _dependency_cycle(containers: list[run_v2.Container], by_name: dict[str, int]) -> list[str]:
    """A dependency cycle as names (first repeated last), or [] when the dependencies are a DAG."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done

    def visit(name: str, path: list[str]) -> list[str]:
        state[name] = 1
        for dependency in containers[by_name[name]].depends_on:
            if state.get(dependency) == 1:
                return [*path[path.index(dependency) :], dependency]
            if dependency not in state:
                found = visit(dependency, [*path, dependency])
                if found:
                    return found
        state[name] = 2
        return []

    for name in by_name:
        if name not in state:
            found = visit(name, [name])
            if found:
                return found
    return []


def start_waves(containers: list[run_v2.Container]) -> list[list[int]]:
    """Container indexes in the order Cloud Run starts them: each wave after every container it depends on passed
    its startup probe ("If you use healthchecks, Cloud Run follows the container startup order and inspects the
    health of each container, making sure each passes successfully before Cloud Run starts up the next container in
    the order": https://cloud.google.com/run/docs/deploying#sidecars as quoted on discuss.google.dev, see
    gmp_sidecar_sources.md section 6). Containers without dependsOn start first, together. Assumes check_service
    passed (names known, no cycle)."""
    by_name = {c.name: i for i, c in enumerate(containers) if c.name}
    placed: dict[int, int] = {}
    while len(placed) < len(containers):
        before = len(placed)
        for index, container in enumerate(containers):
            deps = [by_name[d] for d in container.depends_on if d in by_name and by_name[d] != index]
            if index not in placed and all(d in placed for d in deps):
                placed[index] = 1 + max((placed[d] for d in deps), default=-1)
        if len(placed) == before:  # a cycle (refused at admission): the rest start last
            last = max(placed.values(), default=-1) + 1
            placed.update({i: last for i in range(len(containers)) if i not in placed})
    return [sorted(i for i, w in placed.items() if w == wave) for wave in range(max(placed.values()) + 1)]


def _check_container(index: int, container: run_v2.Container, volume_names: set[str]) -> None:
    prefix = f"spec.template.spec.containers[{index}]"
    if not container.image:
        raise invalid_argument(f"{prefix}.image: required")
    seen: set[str] = set()
    reserved = sorted({e.name for e in container.env} & RESERVED_ENV)
    if reserved:
        raise invalid_argument(
            f"{prefix}.env: The following reserved env names were provided: {', '.join(reserved)}. "
            "These values are automatically set by the system."
        )
    for env in container.env:
        if not ENV_NAME.match(env.name):
            raise invalid_argument(f"{prefix}.env.name: '{env.name}' is not a valid environment variable name")
        if env.name in seen:
            raise invalid_argument(f"{prefix}.env: duplicate name '{env.name}'")
        seen.add(env.name)
    disallowed = [
        m.mount_path
        for m in container.volume_mounts
        if any(m.mount_path == root or m.mount_path.startswith(root + "/") for root in DISALLOWED_MOUNT_ROOTS)
    ]
    if disallowed:
        raise invalid_argument(
            f"{prefix}.volumeMounts: Mount paths [{', '.join(disallowed)}] are in one of disallowed mount "
            f"points [{', '.join(DISALLOWED_MOUNT_ROOTS)}]"
        )
    for mount in container.volume_mounts:
        if mount.name not in volume_names:
            raise invalid_argument(f"{prefix}.volumeMounts[{mount.name}]: no volume named '{mount.name}'")
    if len(container.ports) > 1:
        raise invalid_argument(f"{prefix}.ports: at most one container port may be specified")
    limits = dict(container.resources.limits)
    if "cpu" in limits:
        parse_quantity(limits["cpu"], f"{prefix}.resources.limits.cpu")
    if "memory" in limits:
        parse_quantity(limits["memory"], f"{prefix}.resources.limits.memory")
    if container.startup_probe:
        _check_probe(f"{prefix}.startupProbe", container.startup_probe)
    if container.liveness_probe:
        _check_probe(f"{prefix}.livenessProbe", container.liveness_probe)
        for name in ("initial_delay_seconds", "period_seconds", "timeout_seconds"):
            if (value := getattr(container.liveness_probe, name)) > LIVENESS_LIMIT_S:
                raise invalid_argument(
                    f"{prefix}.livenessProbe.{_camel(name)}: {value} is above the maximum of {LIVENESS_LIMIT_S} seconds"
                )


def _check_probe(field: str, probe: run_v2.Probe) -> None:
    # The GPU-specific ceiling is applied in _check_gpu_and_capacity, which knows the accelerator.
    for name in ("initial_delay_seconds", "period_seconds", "timeout_seconds"):
        value = getattr(probe, name)
        if value < 0:
            raise invalid_argument(f"{field}.{_camel(name)}: must not be negative")
    if probe.period_seconds and probe.timeout_seconds and probe.timeout_seconds > probe.period_seconds:
        raise invalid_argument(
            f"{field}.timeoutSeconds: {probe.timeout_seconds} must not exceed periodSeconds ({probe.period_seconds})"
        )


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def probe_window_limit(gpu: bool) -> int:
    return GPU_PROBE_LIMIT_S if gpu else PROBE_LIMIT_S


def _check_probe_limits(field: str, probe: run_v2.Probe, gpu: bool) -> None:
    limit = probe_window_limit(gpu)
    for name in ("initial_delay_seconds", "period_seconds", "timeout_seconds"):
        value = getattr(probe, name)
        if value > limit:
            raise invalid_argument(f"{field}.{_camel(name)}: {value} is above the maximum of {limit} seconds")
    threshold = probe.failure_threshold or 3
    period = probe.period_seconds or 10
    if threshold * period > limit:
        raise invalid_argument(
            f"{field}: failureThreshold x periodSeconds = {threshold} x {period} = {threshold * period} "
            f"seconds is above the maximum of {limit} seconds"
        )


# Container sizes (Cloud Run docs, "Configure CPU limits" and "Configure memory limits"; the product's planning copy,
# with every source, is blocks/hardware.py). Each container is sized on its own, a container without limits at Cloud
# Run's 1 vCPU / 512 MiB:
# - vCPU 0.08-1 or exactly 1, 2, 4, 6, 8: "spec.template.spec.containers[0].resources.limits.cpu: Invalid value
#   specified for container cpu. Must be equal to one of [.08-1], 1.0, 2.0, 4.0, 6.0, 8.0" (gcloud's refusal of 1.5,
#   verbatim in theredstring/redstring deployment/CLOUD_RUN_CPU_VALUES.md); the container holding an RTX PRO 6000:
#   20-30 in steps of 2, refused with "Must be equal to one of 20.0, 22.0" and so on (the substring
#   justinswe/rules_cloudrun's conformance test, internal/manifest@7bec807, checks against Cloud Run's validateOnly;
#   the rest of the list is its rule table's);
# - memory for the vCPU: "spec.template.spec.containers[0].resources.limits.memory: Invalid value specified for
#   container memory. For 8.0 CPU, memory must be between 4Gi and 32Gi inclusive." (gcloud, quoted in public deploy
#   scripts; the "container memory" wording is what googleapis/python-bigquery-dataframes' system test
#   test_remote_function_gcf_memory_unsupported expects from the real API; "For 1.0 CPU, memory must be between
#   512Mi and 4Gi inclusive" with the second generation's 512 MiB minimum, MarkEdmondson1234/googleCloudRunner#137);
#   the RTX's container 80 GiB up to 4 GiB per vCPU ("memory must be between 80Gi", rules_cloudrun);
# - the L4's container at least 4 vCPU / 16 GiB: "CPU must be at least 4; memory must be at least 16Gi"
#   (rules_cloudrun's conformance substring, both short; one short names its part alone: unconfirmed). The GPU belongs
#   to one container ("If you use sidecar containers, note that the GPU can only be attached to one container",
#   "GPU support for services"), so a sidecar's share does not count towards it;
# - the instance's containers together: "spec.template.spec.containers.resources.limits.cpu: Invalid value specified
#   for cpu. Total millicpu may not exceed 8000." (an L4 service of 8 vCPU plus a sidecar, verbatim in
#   gperdrizet/llm_detector notes/03-cloud_run_deployment.md@065f8ef, where 4 vCPU / 16 GiB plus a 1 vCPU sidecar
#   deployed). No total is published for the RTX PRO 6000: none is applied there.
# The field paths are the v1 form the other messages here keep.
CPU_CHOICES = (1.0, 2.0, 4.0, 6.0, 8.0)
RTX_CPU_CHOICES = (20.0, 22.0, 24.0, 26.0, 28.0, 30.0)
MEMORY_RANGE_MIB = {1.0: (128, 4096), 2.0: (128, 8192), 4.0: (2048, 16384), 6.0: (4096, 24576), 8.0: (4096, 32768)}
GEN2_MIN_MEMORY_MIB = 512
MAX_INSTANCE_MILLICPU = 8000


def _mib_text(mib: float) -> str:
    return f"{mib / 1024:g}Gi" if mib % 1024 == 0 else f"{mib:g}Mi"


def _memory_range(cpu: float, rtx: bool, gen2: bool) -> tuple[float, float]:
    if rtx:
        least, most = GPU_TYPES["nvidia-rtx-pro-6000"].min_memory_gib * 1024, cpu * 4 * 1024
    elif cpu < 1:
        least, most = 128.0, 512.0 if cpu < 0.5 else 1024.0
    else:
        least, most = MEMORY_RANGE_MIB[cpu]
    return (max(least, GEN2_MIN_MEMORY_MIB) if gen2 else least), most


def _check_l4_minimums(prefix: str, cpu: float, memory_mib: float) -> None:
    l4 = GPU_TYPES["nvidia-l4"]
    short = [f"CPU must be at least {l4.min_cpu:g}"] if cpu < l4.min_cpu else []
    short += [f"memory must be at least {l4.min_memory_gib:g}Gi"] if memory_mib < l4.min_memory_gib * 1024 else []
    if short:
        raise invalid_argument(f"{prefix}: {'; '.join(short)}")


def check_container_sizes(
    containers: Sequence[run_v2.Container], field: str, accelerator: str | None, gen2: bool
) -> None:
    """Cloud Run's refusal of a container size it does not offer, or of an instance over its total (above); for
    services and jobs alike (``field``: where the containers are, e.g. ``spec.template.spec.containers``)."""
    total_cpu = 0.0
    for index, container in enumerate(containers):
        limits = dict(container.resources.limits)
        prefix = f"{field}[{index}].resources.limits"
        cpu = parse_quantity(limits.get("cpu", DEFAULT_CPU), f"{prefix}.cpu")
        memory_mib = parse_quantity(limits.get("memory", DEFAULT_MEMORY), f"{prefix}.memory") / 2**20
        total_cpu += cpu
        gpu = GPU_LIMIT_KEY in limits
        rtx = gpu and accelerator == "nvidia-rtx-pro-6000"
        if rtx and cpu not in RTX_CPU_CHOICES:
            choices = ", ".join(f"{c:.1f}" for c in RTX_CPU_CHOICES)
            raise invalid_argument(
                f"{prefix}.cpu: Invalid value specified for container cpu. Must be equal to one of {choices}"
            )
        if not rtx and not (0.08 <= cpu < 1 or cpu in CPU_CHOICES):
            raise invalid_argument(
                f"{prefix}.cpu: Invalid value specified for container cpu. Must be equal to one of [.08-1], 1.0, 2.0, "
                "4.0, 6.0, 8.0"
            )
        least, most = _memory_range(cpu, rtx, gen2)
        if not least <= memory_mib <= most:
            raise invalid_argument(
                f"{prefix}.memory: Invalid value specified for container memory. For {cpu:.1f} CPU, memory must be "
                f"between {_mib_text(least)} and {_mib_text(most)} inclusive."
            )
        if gpu and accelerator == "nvidia-l4":
            _check_l4_minimums(prefix, cpu, memory_mib)
    if accelerator != "nvidia-rtx-pro-6000" and round(total_cpu * 1000) > MAX_INSTANCE_MILLICPU:
        raise invalid_argument(
            f"{field}.resources.limits.cpu: Invalid value specified for cpu. Total millicpu may not exceed "
            f"{MAX_INSTANCE_MILLICPU}."
        )


def _check_gpu_and_capacity(service: run_v2.Service, region: str, config: SandboxConfig) -> None:
    template = service.template
    containers = list(template.containers)
    index = ingress_index(containers)
    container = containers[index]
    prefix = f"spec.template.spec.containers[{index}].resources"
    has_resources = has_field(container, "resources")
    # The instance's totals for the quotas: every container's limits, a container without them counting Cloud Run's
    # defaults (the quotas count what the instance reserves). The GPU's minimums are its container's own
    # (check_container_sizes).
    cpu = memory_gib = 0.0
    for each_index, each in enumerate(containers):
        each_limits = dict(each.resources.limits)
        field = f"spec.template.spec.containers[{each_index}].resources.limits"
        cpu += parse_quantity(each_limits.get("cpu", DEFAULT_CPU), f"{field}.cpu")
        memory_gib += parse_quantity(each_limits.get("memory", DEFAULT_MEMORY), f"{field}.memory") / 2**30
    accelerator = gpu_type_of(template)
    gpu_limits = [dict(c.resources.limits)[GPU_LIMIT_KEY] for c in containers if GPU_LIMIT_KEY in c.resources.limits]
    gpu_count = gpu_limits[0] if len(gpu_limits) == 1 else (str(len(gpu_limits)) if gpu_limits else None)
    gpu = bool(accelerator or gpu_count)
    # A GPU service must set its maximum within the GPU quota (Cloud Run's GPU docs): unset, it is Cloud Run's 100.
    max_instances = max_instances_of(service) or (
        DEFAULT_MAX_INSTANCES if gpu else default_max_instances(cpu, memory_gib, config)
    )
    for index, each in enumerate(template.containers):
        if each.startup_probe:
            _check_probe_limits(f"spec.template.spec.containers[{index}].startupProbe", each.startup_probe, gpu)
    if gpu_count and not accelerator:
        raise invalid_argument(
            "spec.template.spec.nodeSelector: run.googleapis.com/accelerator is required when a GPU limit is set"
        )
    if accelerator and not gpu_count:
        raise invalid_argument(f"{prefix}.limits: nvidia.com/gpu must be set when an accelerator is selected")
    if gpu:
        assert accelerator is not None
        if accelerator not in GPU_TYPES:
            raise invalid_argument(
                f"spec.template.spec.nodeSelector: accelerator '{accelerator}' is not supported; supported: "
                f"{', '.join(sorted(GPU_TYPES))}"
            )
        if gpu_count != "1":
            raise invalid_argument(f"{prefix}.limits.nvidia.com/gpu: exactly 1 GPU per instance is supported")
        kind = GPU_TYPES[accelerator]
        if region not in kind.regions:
            raise invalid_argument(
                f"spec.template.spec.nodeSelector: GPU type '{accelerator}' is not available in region "
                f"'{region}'; available in {', '.join(sorted(kind.regions))}"
            )
        if cpu_idle_effective(container.resources, has_resources):
            raise invalid_argument(
                f"{prefix}.cpuIdle: GPU services require CPU to be always allocated; set cpu_idle to false "
                "(gcloud: --no-cpu-throttling)"
            )
        if template.gpu_zonal_redundancy_disabled:
            quota = config.gpu_quota.get(accelerator, 0)
            if quota == 0:
                # gcloud run deploy on a project without the quota, as printed in PrositAS/eskadra-bielik-misja1's
                # README (176f6530, --no-gpu-zonal-redundancy in europe-west1).
                raise invalid_argument(
                    f"{MAX_SCALE_FIELD}: You do not have quota for using GPUs without zonal redundancy. Learn more "
                    "about GPU zonal redundancy: g.co/cloudrun/gpu-redundancy-help\n\nTo request quota: "
                    "g.co/cloudrun/gpu-quota"
                )
        else:
            quota = config.zonal_redundancy_gpu_quota
            if quota == 0:
                raise GoogleApiError(
                    400,
                    "You do not have quota for using GPUs with zonal redundancy. Learn more about GPU zonal "
                    "redundancy: https://cloud.google.com/run/docs/configuring/services/gpu-zonal-redundancy",
                    "FAILED_PRECONDITION",
                )
        if max_instances > quota:
            raise invalid_argument(
                # As a write-up of the RTX codelab shows it (europe-west4): whole GPUs, though the quota API keeps
                # the RTX Pro 6000's in milli-GPUs.
                f"{MAX_SCALE_FIELD}: Max instances must be set to {quota} or fewer in order to set GPU requirements.\n"
                "Quota violated:\n"
                f"{gpu_quota_id(accelerator, not template.gpu_zonal_redundancy_disabled)} requested: {max_instances} "
                f"allowed: {quota}"
            )
    _check_cpu_and_memory_quota(max_instances, cpu, memory_gib, config)


# Cloud Run's refusal of a deploy whose max instances times one instance's vCPU or memory exceed the region's quota,
# as gcloud printed it (googlecodelabs/feedback#1856 and #2311; the v1 field path, which the v2 API's messages keep
# elsewhere too): the smallest max instances any violated quota allows, worded after the first one violated (vCPU
# before memory, as #1856 lists them), then each violated quota in its raw unit (milli-vCPU, bytes). Whether the
# check also counts other services' instances is not documented: it counts this service alone.
MAX_SCALE_FIELD = "spec.template.metadata.annotations[autoscaling.knative.dev/maxScale]"
QUOTA_ADVICE = (
    "Consider running your workload in a region with greater capacity, or requesting an increase in quota for this "
    "region if you are seeing sustained usage near this limit, see https://cloud.google.com/run/quotas."
)


def _check_cpu_and_memory_quota(max_instances: int, cpu: float, memory_gib: float, config: SandboxConfig) -> None:
    violated = []  # (wording, quota id, requested, allowed, max instances it allows), raw units
    if max_instances * cpu > config.cpu_quota:
        violated.append(("CPU", "CpuAllocPerProjectRegion", round(max_instances * cpu * 1000),
                         round(config.cpu_quota * 1000), math.floor(config.cpu_quota / cpu)))  # fmt: skip
    if max_instances * memory_gib > config.memory_quota_gib:
        allowed = round(config.memory_quota_gib * 2**30)
        violated.append(("memory", "MemAllocPerProjectRegion", round(max_instances * memory_gib * 2**30), allowed,
                         math.floor(config.memory_quota_gib / memory_gib)))  # fmt: skip
    if not violated:
        return
    fits = min(v[4] for v in violated)
    lines = "\n".join(
        f"{quota_id} requested: {requested} allowed: {allowed}" for _, quota_id, requested, allowed, _ in violated
    )
    raise invalid_argument(
        f"{MAX_SCALE_FIELD}: Max instances must be set to {fits} or fewer to set the requested total {violated[0][0]}."
        f"\n{QUOTA_ADVICE}\n\nQuota violated:\n{lines}"
    )
