"""Business hours as a model file states them (deployments/*.yaml `schedule:`), and the scale-service schedules,
warm hours and costs that follow from them. Pure functions: flows/sync_deployments.py writes them into
prefect.yaml, and promote-model prices the service with the same hours."""

from __future__ import annotations

import re
from datetime import datetime, time
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

DAY_NAMES = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"]  # cron numbers them 0-6 from Sunday
DAY_ITEM = re.compile(r"^([a-z]{3}|[0-7])(?:-([a-z]{3}|[0-7]))?$")
HOURS_SUFFIX = "-hours"  # a model file NAME.yaml gives promote-model/NAME and scale-service/NAME-hours


def hours_deployment(model_file_name: str) -> str:
    """The name of the scale-service deployment that keeps a model file's business hours."""
    return f"{model_file_name}{HOURS_SUFFIX}"


def promote_command(scale_deployment: str | None, service: str) -> str:
    """The command that promotes the model a scale-service deployment scales: the model file's own promote-model
    deployment for its NAME-hours deployment, else the by-parameters one."""
    if scale_deployment and scale_deployment.endswith(HOURS_SUFFIX):
        return f"prefect deployment run promote-model/{scale_deployment.removesuffix(HOURS_SUFFIX)}"
    return f"prefect deployment run promote-model/promote -p model=ORG/NAME -p service={service}"


def _day_number(token: str) -> int:
    if token.isdigit():
        return int(token) % 7  # cron allows 7 for Sunday
    return DAY_NAMES.index(token)


def parse_days(value: str) -> list[int]:
    """`mon-fri`, `1-5`, `mon,wed,fri`, `sat-sun`: cron day-of-week numbers, sorted; ValueError when unreadable."""
    days: set[int] = set()
    for item in value.lower().replace(" ", "").split(","):
        match = DAY_ITEM.match(item)
        if not match or any(t and not t.isdigit() and t not in DAY_NAMES for t in match.groups()):
            raise ValueError(
                f"schedule.days: '{value}' is not a list of days; write e.g. mon-fri, 1-5 or mon,wed,fri "
                "(sun..sat, or 0..6 from Sunday)"
            )
        first = _day_number(match.group(1))
        last = _day_number(match.group(2)) if match.group(2) else first
        day = first
        while True:  # a range may wrap over the week's end, e.g. fri-mon
            days.add(day)
            if day == last:
                break
            day = (day + 1) % 7
    return sorted(days)


def cron_days(days: list[int]) -> str:
    """Day numbers as a cron field: runs become ranges (1-5), the rest a list."""
    parts, start = [], None
    for index, day in enumerate(days):
        start = day if start is None else start
        if index + 1 == len(days) or days[index + 1] != day + 1:
            parts.append(str(start) if start == day else f"{start}-{day}")
            start = None
    return ",".join(parts)


class ScaleSchedule(BaseModel):
    slug: str
    cron: str
    timezone: str
    min_instances: int
    warm_until: str | None = None  # scale-ups only: the run does nothing once the day's warm hours are over


def late_scale_up(scheduled: datetime, now: datetime, warm_until: str, timezone: str) -> str | None:
    """Why a scale-up must not run now, or None. A run is late when its worker was down at its time, and Prefect
    then runs late runs oldest first (PrefectHQ/prefect#15886): the 08:00 scale-up of a day whose 19:00 has passed
    would start a GPU at night, if only until the scale-down queued behind it."""
    zone = ZoneInfo(timezone)
    hour, minute = (int(part) for part in warm_until.split(":"))
    local = datetime.fromtimestamp(scheduled.timestamp(), zone)  # stdlib, even from Prefect's pendulum times
    end = local.replace(hour=hour, minute=minute, second=0, microsecond=0)
    running = datetime.fromtimestamp(now.timestamp(), zone)
    if running < end:
        return None
    return (
        f"this scale-up was due at {local:%Y-%m-%d %H:%M} {timezone} and runs at {running:%Y-%m-%d %H:%M}, after that "
        f"day's warm hours ended at {warm_until}: nothing is started at night"
    )


class WarmHours(BaseModel):
    """When a service keeps an instance warm (min 1); at zero (min 0) the rest of the week (lesson 16)."""

    model_config = ConfigDict(extra="forbid")  # a misspelt key (warm_form) must not silently keep the default

    warm_from: time = Field(time(8, 0), description="Local time the service is scaled up to one warm instance.")
    warm_until: time = Field(time(19, 0), description="Local time it is scaled back to zero.")
    days: str = Field("mon-fri", description="Days it is warm: mon-fri, 1-5, mon,wed,fri (cron day-of-week).")
    timezone: str = Field("Europe/Berlin", description="IANA time zone the times are in, e.g. America/New_York.")

    @field_validator("warm_from", "warm_until", mode="before")
    @classmethod
    def _clock(cls, value: object, info) -> object:
        if isinstance(value, int):  # YAML reads 08:00 unquoted as sexagesimal minutes (480)
            value = f"{value // 60:02d}:{value % 60:02d}"
        if isinstance(value, str) and not re.match(r"^([01]\d|2[0-3]):[0-5]\d$", value.strip()):
            raise ValueError(f"schedule.{info.field_name}: '{value}' is not a time of day; write HH:MM, e.g. 08:00")
        return value

    @field_validator("days")
    @classmethod
    def _days(cls, value: str) -> str:
        parse_days(value)
        return value

    @field_validator("timezone")
    @classmethod
    def _timezone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(
                f"schedule.timezone: '{value}' is not an IANA time zone; write e.g. Europe/Berlin or "
                "America/New_York (not an abbreviation such as CEST)"
            ) from None
        return value

    @model_validator(mode="after")
    def _order(self) -> WarmHours:
        if self.warm_until <= self.warm_from:
            raise ValueError(
                f"schedule.warm_until ({self.warm_until:%H:%M}) must be after warm_from ({self.warm_from:%H:%M}) on "
                "the same day; for a service warm around the clock on its days, set min_instances in its profile"
            )
        return self

    @property
    def hours_per_week(self) -> float:
        span = (self.warm_until.hour * 60 + self.warm_until.minute) - (self.warm_from.hour * 60 + self.warm_from.minute)
        return round(span / 60 * len(parse_days(self.days)), 2)

    def schedules(self, name: str) -> list[ScaleSchedule]:
        """Up on the warm days, down in their evening, and down on the other days too: a run missed on Friday
        evening (a worker down) does not keep the GPU warm over the weekend."""
        days = parse_days(self.days)
        off_days = [d for d in range(7) if d not in days]
        up, down = self.warm_from, self.warm_until

        def at(moment: time, on: list[int], slug: str, min_instances: int) -> ScaleSchedule:
            cron = f"{moment.minute} {moment.hour} * * {cron_days(on)}"
            return ScaleSchedule(slug=f"{name}-{slug}", cron=cron, timezone=self.timezone, min_instances=min_instances,
                                 warm_until=f"{down:%H:%M}" if min_instances else None)  # fmt: skip

        found = [at(up, days, "scale-up", 1), at(down, days, "scale-down-evening", 0)]
        if off_days:
            found.append(at(up, off_days, "scale-down-off-days", 0))
        return found
