"""What the sandbox knows about container images: how each one starts its args, and its CUDA build.

Field lessons 1 and 2 (seed 000): Google's Model Garden vLLM image execs its args (they must begin
``vllm serve``) and runs on the L4's CUDA 12.2 driver; the generic ``vllm/vllm-openai`` image prepends
``vllm serve`` itself but is built for a newer CUDA than that driver.

Besides vLLM images, the sandbox knows one sidecar: Google's Managed Service for Prometheus collector for Cloud Run
(GoogleCloudPlatform/run-gmp-sidecar; Cloud Run docs "monitoring-managed-prometheus-sidecar"), any tag or digest.
It runs in-process as a stand-in (gmp_sidecar.py), never as a vLLM container.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MODEL_GARDEN_REPO = "us-docker.pkg.dev/vertex-ai/vertex-vision-model-garden-dockers/pytorch-vllm-serve"
# The GMP sidecar's public image (run-gmp-sidecar README and its run-service-simple.yaml, which pins :1.2.0).
GMP_SIDECAR_REPO = "us-docker.pkg.dev/cloud-ops-agents-artifacts/cloud-run-gmp-sidecar/cloud-run-gmp-sidecar"
VLLM, GMP_COLLECTOR = "vllm", "gmp-collector"
PUBLIC_REPOS = (MODEL_GARDEN_REPO, GMP_SIDECAR_REPO)  # public images in docker.pkg.dev: no project registry lookup


@dataclass(frozen=True)
class ImageBehaviour:
    entrypoint: str  # "exec-args" or "vllm-serve": the sandbox.vllm contract
    cuda: int  # CUDA version the image was built for, as the driver reports it (12020 = 12.2); 0 = CPU
    kind: str = VLLM  # VLLM: runs as the sandbox.vllm stand-in; GMP_COLLECTOR: the Prometheus sidecar stand-in


@dataclass(frozen=True)
class GpuDriver:
    cuda: int


# Cloud Run's drivers (FACTS.md): L4 driver 535 / CUDA 12.2, RTX Pro 6000 driver 580 / CUDA 13.0.
DRIVERS = {"nvidia-l4": GpuDriver(12020), "nvidia-rtx-pro-6000": GpuDriver(13000)}

_KNOWN: list[tuple[re.Pattern[str], ImageBehaviour]] = [
    # Before the generic *-docker.pkg.dev rule below, which would take it for a vLLM build.
    (re.compile(rf"^{re.escape(GMP_SIDECAR_REPO)}([:@]|$)"), ImageBehaviour("none", 0, GMP_COLLECTOR)),
    (re.compile(rf"^{re.escape(MODEL_GARDEN_REPO)}[:@]"), ImageBehaviour("exec-args", 12020)),
    # Docker Hub under each of its host names (any case: DNS) and Google's Hub cache mirror.gcr.io pull the same
    # image (distribution/reference normalize.go; cloud.google.com/artifact-registry/docs/pull-cached-dockerhub-images).
    (
        re.compile(
            r"^(?i:(?:docker\.io|index\.docker\.io|registry-1\.docker\.io|registry\.hub\.docker\.com|mirror\.gcr\.io)/)?"
            r"vllm/vllm-openai([:@]|$)"
        ),
        ImageBehaviour("vllm-serve", 12090),
    ),
    # Images built into Artifact Registry from vLLM's Dockerfiles: entrypoint `vllm serve`, CPU or GPU build.
    (re.compile(r"^[a-z0-9-]+-docker\.pkg\.dev/[^/]+/[^/]+/[^:@]*cpu[^:@]*([:@]|$)"), ImageBehaviour("vllm-serve", 0)),
    (re.compile(r"^[a-z0-9-]+-docker\.pkg\.dev/"), ImageBehaviour("vllm-serve", 12020)),
]


def image_behaviour(image: str) -> ImageBehaviour | None:
    """How ``image`` starts, or None when no registry the sandbox knows has it (Cloud Run: image not found)."""
    for pattern, behaviour in _KNOWN:
        if pattern.search(image):
            return behaviour
    return None
