"""Container sizes Cloud Run takes: the instance split between vLLM and the metrics collector, and preflight's refusal,
with the fix, of a profile whose totals no container size Cloud Run offers adds up to (blocks/hardware.py)."""

from __future__ import annotations

import itertools

import pytest

from blocks import GcpTarget, ModelSource, ServingProfile
from blocks.hardware import instance_cpu_limit, size_problem
from blocks.profile import PRESETS
from tasks.checks.preflight import check_container_sizes, check_profile, raise_on_errors
from tasks.deploy.metrics_sidecar import Split, nearest_split, split_instance
from tasks.deploy.render import Weights, render_service

TARGET = GcpTarget(project="acme-ml-prod", region="us-central1")
SOURCE = ModelSource(repo_id="org/model")
WEIGHTS = Weights("org/model", "a" * 40, TARGET.bucket_name, f"model-cache/org/model/{'a' * 40}", 5 * 10**9)
GPU_TYPES = (None, "nvidia-l4", "nvidia-rtx-pro-6000")


def mib(quantity: str) -> int:
    return int(quantity.removesuffix("Gi")) * 1024 if quantity.endswith("Gi") else int(quantity.removesuffix("Mi"))


def accepted(split: Split, gpu_type: str | None) -> bool:
    """Every container of the split a size Cloud Run offers, the instance within its total."""
    vllm_ok = size_problem(split.vllm_cpu, split.vllm_memory_mib, gpu_type) is None
    sidecar_ok = not split.sidecar_cpu or size_problem(split.sidecar_cpu, split.sidecar_memory_mib, None) is None
    limit = instance_cpu_limit(gpu_type)
    return vllm_ok and sidecar_ok and (limit is None or split.vllm_cpu + split.sidecar_cpu <= limit)


def test_the_l4_preset_splits_into_sizes_cloud_run_takes_keeping_its_totals():
    # main gave vLLM 7 vCPU / 31.5 GiB: 7 vCPU is no size Cloud Run offers ("Must be equal to one of [.08-1], 1.0,
    # 2.0, 4.0, 6.0, 8.0"), and 8 vCPU beside the collector's exceeds the instance's 8.
    assert split_instance(8, 32, "nvidia-l4", True) == Split(6, 24 * 1024, 2, 8 * 1024)
    assert split_instance(8, 32, "nvidia-l4", False) == Split(8, 32 * 1024)
    assert split_instance(4, 10, None, True) == Split(2, 8 * 1024, 2, 2 * 1024)  # the cpu preset: 3 vCPU is no size


@pytest.mark.parametrize("gpu_type", GPU_TYPES)
def test_every_split_is_sizes_cloud_run_takes_and_adds_up_to_the_profile(gpu_type):
    for cpu, memory_gib, sidecar in itertools.product(range(1, 33), range(1, 129), (False, True)):
        split = split_instance(cpu, memory_gib, gpu_type, sidecar)
        if split is None:
            continue
        assert accepted(split, gpu_type), (cpu, memory_gib, sidecar, split)
        assert split.vllm_cpu + split.sidecar_cpu == cpu
        assert split.vllm_memory_mib + split.sidecar_memory_mib == memory_gib * 1024
        assert bool(split.sidecar_cpu) == sidecar


@pytest.mark.parametrize(
    ("cpu", "memory_gib", "gpu_type", "sidecar", "nearest"),
    [
        (20, 80, "nvidia-rtx-pro-6000", True, (21, 81)),  # the RTX preset: 20 / 80 are its GPU container's minimum
        (4, 16, "nvidia-l4", True, (5, 17)),
        (7, 28, "nvidia-l4", False, (8, 28)),  # grows to a size rather than shrinking
        (8, 40, "nvidia-l4", False, (8, 32)),  # no larger instance: shrinks to the nearest
        (3, 10, None, False, (4, 10)),
    ],
)
def test_totals_that_split_into_nothing_get_the_nearest_that_do(cpu, memory_gib, gpu_type, sidecar, nearest):
    assert split_instance(cpu, memory_gib, gpu_type, sidecar) is None
    found_cpu, found_memory, split = nearest_split(cpu, memory_gib, gpu_type, sidecar)
    assert (found_cpu, found_memory) == nearest
    assert split == split_instance(found_cpu, found_memory, gpu_type, sidecar) and accepted(split, gpu_type)


@pytest.mark.parametrize(("preset", "metrics"), list(itertools.product(PRESETS, ("none", "vllm"))))
def test_each_preset_renders_sizes_cloud_run_takes_or_preflight_says_which_totals_do(preset, metrics):
    profile = ServingProfile.preset(preset, metrics=metrics)
    service = render_service(profile, TARGET, SOURCE, WEIGHTS, profile.image or "img:1", revision="r")
    limits = [dict(c.resources.limits) for c in service.template.containers]
    findings = check_container_sizes(profile)
    if (preset, metrics) == ("rtx-pro-6000", "vllm"):
        [finding] = findings
        assert finding.severity == "error" and finding.setting == "cpu"
        assert "set cpu to 21 and memory_gib to 81 (vLLM 20 vCPU / 80 GiB, the collector 1 vCPU / 1 GiB)" in (
            finding.message
        )
        return
    assert findings == []
    sizes = [(int(x["cpu"]), mib(x["memory"]), profile.gpu_type if "nvidia.com/gpu" in x else None) for x in limits]
    assert [size_problem(*size) for size in sizes] == [None] * len(sizes)
    assert (sum(s[0] for s in sizes), sum(s[1] for s in sizes)) == (profile.cpu, profile.memory_gib * 1024)


def test_preflight_refuses_a_size_cloud_run_does_not_offer_before_any_cloud_write():
    findings = check_profile(ServingProfile.preset("l4", cpu=7), TARGET, "svc")
    with pytest.raises(ValueError, match="cpu: Cloud Run refuses 7 vCPU / 32 GiB: the container holding the nvidia-l4 "
                       "may have 4, 6, 8 vCPU, not 7; set cpu to 8"):  # fmt: skip
        raise_on_errors(findings)
    [finding] = check_container_sizes(ServingProfile.preset("l4", memory_gib=40))
    assert finding.setting == "memory_gib" and "may have 16 to 32 GiB, not 40; set memory_gib to 32" in finding.message
