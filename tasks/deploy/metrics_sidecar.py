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

Resources. The samples set none; a container without limits gets Cloud Run's 1 vCPU / 512 MiB. We set those
explicitly and take them out of the profile's totals, so an instance still costs and counts against quota what the
profile says (the GPU presets' 8 vCPU / 32 GiB and 20 vCPU / 80 GiB); a whole vCPU, because Cloud Run allows a
fraction of a vCPU only with request-based billing (Cloud Run docs, "Configure CPU limits for services").
"""

from __future__ import annotations

from google.cloud import run_v2

SIDECAR_REPOSITORY = "us-docker.pkg.dev/cloud-ops-agents-artifacts/cloud-run-gmp-sidecar/cloud-run-gmp-sidecar"
SIDECAR_IMAGE = f"{SIDECAR_REPOSITORY}:1.2.0"
SIDECAR_NAME = "collector"
SIDECAR_CPU = 1
SIDECAR_MEMORY_MIB = 512
SCRAPE_PORT = 8080  # DefaultRunMonitoringConfig's endpoint port
LIVENESS_PORT, LIVENESS_PATH = 13133, "/liveness"


def sidecar_container(ingress_name: str, cpu_idle: bool) -> run_v2.Container:
    """The collector, started after vLLM's container passed its startup probe, with its default config; its CPU is
    billed as vLLM's is (``cpu_idle``: one billing setting for the instance)."""
    return run_v2.Container(
        name=SIDECAR_NAME,
        image=SIDECAR_IMAGE,
        depends_on=[ingress_name],
        resources=run_v2.ResourceRequirements(
            limits={"cpu": str(SIDECAR_CPU), "memory": f"{SIDECAR_MEMORY_MIB}Mi"}, cpu_idle=cpu_idle
        ),
        liveness_probe=run_v2.Probe(
            http_get=run_v2.HTTPGetAction(path=LIVENESS_PATH, port=LIVENESS_PORT),
            period_seconds=30,
            timeout_seconds=30,
        ),
    )


def vllm_share(cpu: int, memory_gib: int, with_sidecar: bool) -> tuple[int, int]:
    """vLLM's container's vCPU and MiB: the profile's totals, less the sidecar's when it runs."""
    memory_mib = memory_gib * 1024
    if not with_sidecar:
        return cpu, memory_mib
    return cpu - SIDECAR_CPU, memory_mib - SIDECAR_MEMORY_MIB
