"""A first RTX Pro 6000 promotion on a new project's Cloud Run quotas, the sandbox's defaults (20 vCPU, 40 GiB, one RTX
GPU kept as 1000 milli-GPUs: googlecodelabs/feedback#1856 and #2311, docs/sandbox.md): refused by promote-model's
preflight before it writes anything, naming the quota and the request. On main before this check it made 22 cloud
writes and staged the weights, then Cloud Run refused the service.

And a GPU quota raised with Google: promote-model, scale-service and doctor judge by the one figure Service Usage
reports (tasks/checks/quotas.py), with no gpu_quota in the profile."""

from __future__ import annotations

import pytest

from blocks.profile import ServingProfile
from flows.promote import promote_model
from flows.scale import scale_service
from tasks.checks import doctor
from tasks.checks.quotas import QuotaExceeded
from tests.support.artifacts import artifact
from tests.support.promotion import promote, run_service
from tests.support.sandbox_config import sandbox_settings

pytestmark = pytest.mark.prefect
# What a project that asked Google for 8 L4 GPUs asked for beside them: the vCPU and memory of 10 L4 instances (8 vCPU,
# 32 GiB each), so that only the GPU quota speaks below.
CPU_AND_MEMORY_RAISED = {"cpu_quota": 80, "memory_quota_gib": 320}
READ_VERBS = (":testIamPermissions", ":getEffectivePolicy", ":batchGet")


def cloud_writes(sb, since: int) -> list[str]:
    """Every call since ``since`` to the Google stand-ins that is not a read."""
    return [
        f"{r['server']} {r['method']} {r['path']}"
        for r in sb.requests(since=since)
        if r["server"] in ("control", "gcs") and r["method"] != "GET" and not r["path"].endswith(READ_VERBS)
    ]


def test_the_first_rtx_promotion_on_a_new_projects_quotas_is_refused_before_any_write(sb, flow_env):
    since = sb.last_request_seq()
    with pytest.raises(QuotaExceeded) as refused:
        promote_model(model="sandbox/tiny-chat", service="quota-rtx", profile="rtx-pro-6000",
                      token_secret_block="sandbox-hf-token")  # fmt: skip
    message = str(refused.value)
    assert message.startswith("max_instances: 1 instance(s) of 20 vCPU, 80 GiB and a nvidia-rtx-pro-6000 GPU")
    assert "MemAllocPerProjectRegion (run.googleapis.com/mem_allocation) in us-central1: 80 GiB" in message
    assert "Request MemAllocPerProjectRegion of 85899345920 bytes (80 GiB)" in message
    # 20 vCPU and the one GPU (the quota API's 1000 milli-GPUs) are enough: only memory is named.
    assert "CpuAllocPerProjectRegion" not in message and "Gpu" not in message
    assert cloud_writes(sb, since) == []
    assert "MemAllocPerProjectRegion" in artifact("promotion-quota-rtx")


def test_with_the_quota_raised_the_same_promotion_passes_preflight(sb, flow_env):
    """The refusal is the quota's, not the profile's: with 80 GiB the preflight lets the promotion through."""
    with sandbox_settings(sb, memory_quota_gib=80):
        report = promote_model(model="sandbox/tiny-chat", service="quota-rtx-ok", profile="rtx-pro-6000",
                               token_secret_block="sandbox-hf-token", dry_run=True)  # fmt: skip
    assert report.outcome == "dry-run"


def test_a_gpu_quota_raised_with_google_serves_preflight_scale_and_doctor_without_the_profile_repeating_it(
    sb, flow_env
):
    """Issue 34: the profile's gpu_quota (3 unless set), the presets' and Service Usage's figures disagreed, and a
    quota raised with Google was refused unless the profile repeated it. Here Service Usage reports 8 L4 GPUs and the
    profile says nothing of its quota."""
    service, profile = "quota-raised", "e2e-quota-raised-l4"
    five = ServingProfile.preset("l4", max_instances=5)
    assert five.gpu_quota is None
    five.save(profile, overwrite=True)
    raised = {**sb.configure()["gpu_quota"], "nvidia-l4": 8}
    with sandbox_settings(sb, **CPU_AND_MEMORY_RAISED, gpu_quota=raised):
        report = promote(service, profile=profile)  # 5 instances: above a new project's 3, within the project's 8
        assert report.outcome == "promoted", report.reason
        assert run_service(flow_env, service).template.scaling.max_instance_count == 5
        assert scale_service(service=service, min_instances=0, max_instances=8).max_instances == 8
        with pytest.raises(QuotaExceeded) as scaled_over:
            scale_service(service=service, min_instances=0, max_instances=9)
        rows = {row.name: row for row in doctor.check_quotas(flow_env, five)}
        over = {row.name: row for row in doctor.check_quotas(flow_env, five.model_copy(update={"max_instances": 9}))}
    assert "the project has 8" in str(scaled_over.value) and "set max_instances to 8 or fewer" in str(scaled_over.value)
    assert run_service(flow_env, service).scaling.max_instance_count == 8  # the refused scale changed nothing
    assert rows["GPU quota"].status == "ok" and "the project has 8." in rows["GPU quota"].detail
    assert over["GPU quota"].status == "fail" and "the project has 8:" in over["GPU quota"].detail
    # Google's default GPU quota back: the same profile is refused before anything is written, by the same figure.
    with (
        sandbox_settings(sb, **CPU_AND_MEMORY_RAISED),
        pytest.raises(QuotaExceeded, match=r"the project has 3\. .* or set max_instances to 3 or fewer"),
    ):
        promote_model(model="sandbox/tiny-chat", service="quota-default", profile=profile,
                      token_secret_block="sandbox-hf-token", dry_run=True)  # fmt: skip
