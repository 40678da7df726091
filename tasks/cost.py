"""What a served model costs: per instance-hour from the profile's prices, per month always-on vs scheduled."""

from __future__ import annotations

from pydantic import BaseModel

from blocks.profile import ServingProfile

HOURS_PER_WEEK = 168
WEEKS_PER_MONTH = 365.25 / 12 / 7


class CostEstimate(BaseModel):
    hourly_usd: float
    warm_hours_per_week: float
    scheduled_monthly_usd: float
    always_on_monthly_usd: float

    @property
    def saving_share(self) -> float:
        return 1 - self.scheduled_monthly_usd / self.always_on_monthly_usd if self.always_on_monthly_usd else 0.0


def estimate(profile: ServingProfile, warm_hours_per_week: float) -> CostEstimate:
    """Monthly cost when min instances are up ``warm_hours_per_week`` (lesson 16), against always-on.

    A floor: with min instances 0 off-hours, requests still start instances, billed while they serve.
    """
    warm = max(0.0, min(warm_hours_per_week, HOURS_PER_WEEK))
    instances = max(profile.min_instances, 1)
    hourly = profile.hourly_usd
    return CostEstimate(
        hourly_usd=round(hourly, 3),
        warm_hours_per_week=warm,
        scheduled_monthly_usd=round(hourly * instances * warm * WEEKS_PER_MONTH, 2),
        always_on_monthly_usd=round(hourly * instances * HOURS_PER_WEEK * WEEKS_PER_MONTH, 2),
    )
