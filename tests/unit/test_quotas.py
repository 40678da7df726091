"""Cloud Run's regional quotas in the units Service Usage keeps them in, and the refusal a user reads."""

from __future__ import annotations

import math

from blocks.profile import PRESETS, ServingProfile
from blocks.target import GcpTarget
from tasks.checks.quotas import ASSUMED, CPU, MEMORY, Need, gpu_quota, quotas_for, raw, refusal, unread_gpus

RTX = ServingProfile(**PRESETS["rtx-pro-6000"])
TARGET = GcpTarget(project="acme-ml-prod", region="us-central1")


def test_gpu_quotas_carry_the_ids_cloud_run_names_and_the_rtx_counts_milli_gpus():
    l4 = gpu_quota("nvidia-l4", zonal_redundancy=False)
    assert l4.metric == "run.googleapis.com/nvidia_l4_gpu_allocation_no_zonal_redundancy"
    assert l4.quota_id == "NvidiaL4GpuAllocNoZonalRedundancyPerProjectRegion"
    assert l4.raw_per_unit == 1
    rtx = gpu_quota("nvidia-rtx-pro-6000", zonal_redundancy=False)
    assert rtx.quota_id == "NvidiaRtxPro6000GpuAllocNoZonalRedundancyPerProjectRegion"
    assert rtx.raw_per_unit == 1000  # the quota API's 1000 is one GPU
    assert gpu_quota("nvidia-l4", zonal_redundancy=True).quota_id == "NvidiaL4GpuAllocPerProjectRegion"


def test_an_rtx_instance_draws_20_vcpu_80_gib_and_one_gpu():
    needs = {q.quota_id: per for q, per in quotas_for(RTX)}
    assert needs == {"CpuAllocPerProjectRegion": 20, "MemAllocPerProjectRegion": 80,
                     "NvidiaRtxPro6000GpuAllocNoZonalRedundancyPerProjectRegion": 1}  # fmt: skip


def test_raw_amounts_are_what_a_quota_request_is_filed_in():
    assert raw(80, MEMORY) == "85899345920 bytes (80 GiB)"  # googlecodelabs/feedback#2311's "requested"
    assert raw(60, CPU) == "60000 milli-vCPU (60 vCPU)"  # #1856's
    assert raw(2, gpu_quota("nvidia-rtx-pro-6000", False)) == "2000 milli-GPU (2 GPU)"
    assert raw(3, gpu_quota("nvidia-l4", False)) == "3 GPU"


def test_a_new_projects_40_gib_refuses_the_first_rtx_service_naming_quota_and_request():
    needs = [Need(CPU, 20, 1, 20), Need(MEMORY, 80, 1, 40), Need(gpu_quota("nvidia-rtx-pro-6000", False), 1, 1, 1)]
    message = refusal(needs, TARGET, "max_instances", "1 instance(s) of 20 vCPU, 80 GiB")
    assert message is not None
    assert "MemAllocPerProjectRegion (run.googleapis.com/mem_allocation) in us-central1: 80 GiB" in message
    assert "the project has 40" in message
    assert "Request MemAllocPerProjectRegion of 85899345920 bytes (80 GiB)" in message
    assert "Max instances must be set to 0 or fewer" in message
    assert "CpuAllocPerProjectRegion" not in message  # 20 vCPU fit: only what is short is named
    assert "pick a profile whose instance fits" in message  # no max_instances fits: 0 would serve nothing


def test_quotas_that_fit_or_are_unlimited_refuse_nothing_and_the_fit_is_the_smallest():
    assert refusal([Need(CPU, 20, 1, math.inf), Need(MEMORY, 80, 1, 400)], TARGET, "max_instances", "x") is None
    three = [Need(CPU, 8, 3, 20), Need(MEMORY, 32, 3, 40)]
    assert "set max_instances to 1" in (refusal(three, TARGET, "max_instances", "x") or "")


def test_an_unread_gpu_quota_is_the_one_given_else_a_new_projects_default():
    assert unread_gpus("nvidia-l4", False, 6) == (6, "as gpu_quota gives it")
    assert unread_gpus("nvidia-l4", False, None) == (3, ASSUMED)
    assert unread_gpus("nvidia-rtx-pro-6000", False, None) == (1, ASSUMED)
    assert unread_gpus("nvidia-l4", True, None) == (0, ASSUMED)  # zonal redundancy: its own quota, none at first
    assert unread_gpus("nvidia-h100", False, None) == (None, "unknown GPU type")  # not judged: Cloud Run decides


def test_a_refusal_on_the_assumed_gpu_quota_says_it_was_assumed_and_how_to_give_the_projects():
    """What the profile check "max_instances above gpu_quota" said (lesson 6), now from the one GPU quota figure."""
    l4 = gpu_quota("nvidia-l4", False)
    assumed = Need(l4, 1, 4, 3, f"{ASSUMED}: Service Usage could not be read")
    message = refusal([assumed], TARGET, "max_instances", "4 instance(s) of 8 vCPU, 32 GiB and a nvidia-l4 GPU") or ""
    assert "4 GPU for 4 instance(s) of 1 GPU; the project has 3 (a new project's default, assumed; give the " in message
    assert "Request NvidiaL4GpuAllocNoZonalRedundancyPerProjectRegion of 4 GPU" in message
    assert message.endswith("or set max_instances to 3 or fewer")


def test_no_gpu_quota_at_all_is_quoted_in_cloud_runs_words_for_it():
    needs = [Need(gpu_quota("nvidia-l4", False), 1, 1, 0)]
    message = refusal(needs, TARGET, "max_instances", "1 instance(s) with an L4")
    assert message is not None and "You do not have quota for using GPUs" in message
    assert "Max instances must be set to" not in message
    assert "Request NvidiaL4GpuAllocNoZonalRedundancyPerProjectRegion of 1 GPU" in message
