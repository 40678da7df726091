"""Google's Managed Service for Prometheus sidecar beside vLLM (profile ``metrics: vllm``): what it is and how it sits
in the instance.

Google's recommended way to collect a Cloud Run container's Prometheus metrics (Cloud Run docs, "Write Prometheus
metrics by using the Prometheus sidecar", cloud.google.com/run/docs/monitoring-managed-prometheus-sidecar). Facts from
GoogleCloudPlatform/run-gmp-sidecar (snapshot 056abb4; quoted in sandbox/control/run/gmp_sidecar_sources.md):
- the image is ``us-docker.pkg.dev/cloud-ops-agents-artifacts/cloud-run-gmp-sidecar/cloud-run-gmp-sidecar``; 1.2.0 is
  the newest tag the repository's own service samples pin (run-service-simple.yaml);
- with no RunMonitoring config mounted (``/etc/rungmp/config.yaml``) it uses ``DefaultRunMonitoringConfig``: job
  ``run-gmp-sidecar``, ``0.0.0.0:8080/metrics`` every 30 s, and every metadata label (confgenerator/config.go). The
  port is hard-coded: sidecars do not get ``PORT``. So vLLM must listen on 8080 for the default config to find it,
  which preflight checks; no secret, volume or accessor grant is needed;
- the samples start the collector after the app (``run.googleapis.com/container-dependencies: {"collector":["app"]}``,
  run.v2 ``dependsOn``) and probe its liveness at ``:13133/liveness`` every 30 s;
- it does a start-up scrape after 10 s and a shut-down scrape; Google recommends instance-based billing so that
  scrapes are not throttled (the docs page): GPU services have CPU always allocated anyway;
- the service's account needs ``roles/monitoring.metricWriter`` (the repository's README).

Resources. The samples set none; a container without limits gets Cloud Run's 1 vCPU / 512 MiB. Cloud Run sizes each
container on its own (blocks/hardware.py, CONTAINER_SIZES: whole vCPUs of 1, 2, 4, 6 or 8, memory per vCPU, the GPU
container keeping its GPU's minimums, at most 8 vCPU in all), so the profile's totals are split, not just reduced:
vLLM gets the largest share Cloud Run takes and the collector the rest, so that the instance still costs and counts
against quota what the profile says. On the L4 preset's 8 vCPU / 32 GiB that is vLLM 6 vCPU / 24 GiB and the
collector 2 vCPU / 8 GiB: 7 vCPU, what taking 1 vCPU off would leave, is no size Cloud Run takes, and 6 vCPU hold at
most 24 GiB. A profile whose totals cannot be split (the RTX PRO 6000 preset's 20 vCPU / 80 GiB are its GPU's own
minimum) is refused by preflight before any cloud write, with the nearest totals that can (``nearest_split``).
"""

from __future__ import annotations

from dataclasses import dataclass

from google.cloud import run_v2

from blocks.hardware import container_cpus, instance_cpu_limit, memory_range_mib

SIDECAR_REPOSITORY = "us-docker.pkg.dev/cloud-ops-agents-artifacts/cloud-run-gmp-sidecar/cloud-run-gmp-sidecar"
SIDECAR_IMAGE = f"{SIDECAR_REPOSITORY}:1.2.0"
SIDECAR_NAME = "collector"
SIDECAR_CPU = 1
SIDECAR_MEMORY_MIB = 512
SCRAPE_PORT = 8080  # DefaultRunMonitoringConfig's endpoint port
LIVENESS_PORT, LIVENESS_PATH = 13133, "/liveness"


@dataclass(frozen=True)
class Split:
    """The instance's vCPUs and MiB as its containers get them: vLLM's, then the collector's (0 without it)."""

    vllm_cpu: int
    vllm_memory_mib: int
    sidecar_cpu: int = 0
    sidecar_memory_mib: int = 0


def memory_quantity(mib: int) -> str:
    """A memory limit as Cloud Run's examples write it: whole GiB as ``Gi``, anything else in ``Mi``."""
    return f"{mib // 1024}Gi" if mib % 1024 == 0 else f"{mib}Mi"


def sidecar_container(ingress_name: str, cpu_idle: bool, split: Split) -> run_v2.Container:
    """The collector, started after vLLM's container passed its startup probe, with its default config and its share
    of the instance (``split``); its CPU is billed as vLLM's is (``cpu_idle``: one billing setting for the instance)."""
    limits = {"cpu": str(split.sidecar_cpu), "memory": memory_quantity(split.sidecar_memory_mib)}
    return run_v2.Container(
        name=SIDECAR_NAME,
        image=SIDECAR_IMAGE,
        depends_on=[ingress_name],
        resources=run_v2.ResourceRequirements(limits=limits, cpu_idle=cpu_idle),
        liveness_probe=run_v2.Probe(
            http_get=run_v2.HTTPGetAction(path=LIVENESS_PATH, port=LIVENESS_PORT),
            period_seconds=30,
            timeout_seconds=30,
        ),
    )


def split_instance(cpu: int, memory_gib: int, gpu_type: str | None, with_sidecar: bool) -> Split | None:
    """The profile's totals as Cloud Run takes them: vLLM's container alone, or with the collector beside it vLLM the
    most vCPU, then the most memory, that leave the collector a size of its own with the totals unchanged. None when
    no split adds up to the totals (preflight says so, with ``nearest_split``'s)."""
    memory_mib = memory_gib * 1024
    limit = instance_cpu_limit(gpu_type)
    if limit is not None and cpu > limit:
        return None
    if not with_sidecar:
        bounds = memory_range_mib(cpu, gpu_type)
        return Split(cpu, memory_mib) if bounds and bounds[0] <= memory_mib <= bounds[1] else None
    for vllm_cpu in sorted(container_cpus(gpu_type), reverse=True):
        mine, theirs = memory_range_mib(vllm_cpu, gpu_type), memory_range_mib(cpu - vllm_cpu, None)
        if mine is None or theirs is None:
            continue
        vllm_memory = min(mine[1], memory_mib - theirs[0])
        if vllm_memory >= mine[0] and memory_mib - vllm_memory <= theirs[1]:
            return Split(vllm_cpu, vllm_memory, cpu - vllm_cpu, memory_mib - vllm_memory)
    return None


def vllm_share(cpu: int, memory_gib: int, gpu_type: str | None, with_sidecar: bool) -> Split:
    """The split the service is rendered with: ``split_instance``'s, or when there is none, the collector's own
    minimum taken off the totals (1 vCPU, 512 MiB), which preflight refuses before any cloud write."""
    split = split_instance(cpu, memory_gib, gpu_type, with_sidecar)
    if split is not None:
        return split
    if not with_sidecar:
        return Split(cpu, memory_gib * 1024)
    return Split(cpu - SIDECAR_CPU, memory_gib * 1024 - SIDECAR_MEMORY_MIB, SIDECAR_CPU, SIDECAR_MEMORY_MIB)


def nearest_split(cpu: int, memory_gib: int, gpu_type: str | None, with_sidecar: bool) -> tuple[int, int, Split]:
    """The totals (vCPU, GiB) nearest the profile's that ``split_instance`` can split, and their split: growing the
    profile before shrinking it, then the cheapest change (a vCPU counted as 4 GiB, its share of the memory table)."""
    candidates = [
        (c, m, split)
        for c in range(1, max(cpu, 8) + 12)
        for m in range(1, max(memory_gib, 32) + 48)
        if (split := split_instance(c, m, gpu_type, with_sidecar)) is not None
    ]
    return min(
        candidates, key=lambda x: (x[0] < cpu or x[1] < memory_gib, 4 * abs(x[0] - cpu) + abs(x[1] - memory_gib))
    )
