"""Business hours from a model file: the scale schedules, warm hours and prefect.yaml entries they give."""

from __future__ import annotations

from datetime import datetime

import pytest
import yaml
from pydantic import ValidationError

from flows.sync_deployments import PREFECT_FILES, ROOT, generated_block, model_deployments, synced
from tasks.report.schedules import WarmHours, late_scale_up, parse_days


@pytest.mark.parametrize(
    ("days", "numbers"),
    [("mon-fri", [1, 2, 3, 4, 5]), ("1-5", [1, 2, 3, 4, 5]), ("mon,wed,fri", [1, 3, 5]), ("sat-sun", [0, 6]),
     ("fri-mon", [0, 1, 5, 6]), ("7", [0]), ("Mon-Thu, Sat", [1, 2, 3, 4, 6])],
)  # fmt: skip
def test_days_are_read_as_cron_reads_them(days, numbers):
    assert parse_days(days) == numbers


def test_default_business_hours_give_the_three_schedules_and_55_warm_hours():
    hours = WarmHours()
    assert [(s.slug, s.cron, s.timezone, s.min_instances) for s in hours.schedules("chat")] == [
        ("chat-scale-up", "0 8 * * 1-5", "Europe/Berlin", 1),
        ("chat-scale-down-evening", "0 19 * * 1-5", "Europe/Berlin", 0),
        ("chat-scale-down-off-days", "0 8 * * 0,6", "Europe/Berlin", 0),
    ]
    assert hours.hours_per_week == 55


def test_other_hours_days_and_zone():
    hours = WarmHours(warm_from="07:30", warm_until="22:15", days="mon-sat", timezone="America/New_York")
    assert [s.cron for s in hours.schedules("x")] == ["30 7 * * 1-6", "15 22 * * 1-6", "30 7 * * 0"]
    assert hours.hours_per_week == 88.5
    every_day = WarmHours(days="sun-sat")
    assert [s.slug for s in every_day.schedules("x")] == ["x-scale-up", "x-scale-down-evening"]  # no off days


def test_times_yaml_reads_as_numbers_are_still_times():
    spec = yaml.safe_load("warm_from: 08:00\nwarm_until: 19:00\n")  # 19:00 unquoted is sexagesimal 1140 to YAML
    assert spec["warm_until"] == 1140
    assert WarmHours.model_validate(spec).schedules("x")[1].cron == "0 19 * * 1-5"


@pytest.mark.parametrize(
    ("schedule", "field", "fix"),
    [
        ({"warm_from": "8am"}, "schedule.warm_from", "write HH:MM"),
        ({"warm_until": "24:00"}, "schedule.warm_until", "write HH:MM"),
        ({"warm_from": "19:00", "warm_until": "08:00"}, "schedule.warm_until (08:00) must be after", "min_instances"),
        ({"days": "weekdays"}, "schedule.days", "mon-fri"),
        ({"days": "mon-fry"}, "schedule.days", "mon-fri"),
        ({"timezone": "CEST"}, "schedule.timezone", "Europe/Berlin"),
        ({"timezone": "Europe/Berlinn"}, "schedule.timezone", "IANA"),
    ],
)
def test_bad_business_hours_name_the_field_and_the_fix(schedule, field, fix):
    with pytest.raises(ValidationError) as caught:
        WarmHours.model_validate(schedule)
    assert field in str(caught.value) and fix in str(caught.value)


@pytest.mark.parametrize("prefect_file", sorted(PREFECT_FILES), ids=lambda p: str(p.relative_to(ROOT)))
def test_prefect_files_are_in_step_with_the_model_files(prefect_file):
    current = prefect_file.read_text()
    assert synced(current, generated_block(PREFECT_FILES[prefect_file])) == current, (
        "run `python -m flows.sync_deployments`"
    )


def test_a_real_project_gets_the_real_models_and_the_sandbox_gets_its_example():
    real = {d["name"]: d for d in yaml.safe_load((ROOT / "prefect.yaml").read_text())["deployments"]}
    sandbox = {d["name"]: d for d in yaml.safe_load((ROOT / "sandbox" / "prefect.yaml").read_text())["deployments"]}
    # The generic deployment takes any model by parameters; each model file has its own pair.
    assert "parameters" not in real["promote"] and real["promote"]["entrypoint"] == "flows/promote.py:promote_model"
    assert real["gemma-4-e2b"]["parameters"] == {"spec_file": "deployments/gemma-4-e2b.yaml"}
    assert real["gemma-4-31b-hours"]["parameters"]["target"] == "production"
    # Nothing of the sandbox's reaches prefect.yaml, and its example is in its own file.
    assert not [n for n, d in real.items() if "sandbox" in str(d.get("parameters"))], real.keys()
    assert sandbox["tiny-chat"]["parameters"] == {"spec_file": "deployments/sandbox/tiny-chat.yaml"}
    crons = [s["cron"] for s in sandbox["tiny-chat-hours"]["schedules"]]
    assert crons == ["0 8 * * 1-5", "0 19 * * 1-5", "0 8 * * 0,6"]
    # Each has a slug and no `active:`: a redeploy updates it by its slug and keeps the state its operator chose
    # (tests/e2e/test_schedule_control.py deploys it twice over an operator's pause).
    schedules = [s for d in [*real.values(), *sandbox.values()] for s in d.get("schedules", [])]
    assert schedules and all(s["slug"] and "active" not in s for s in schedules)


def test_a_new_model_file_gets_its_deployments(tmp_path):
    folder = tmp_path / "deployments"
    folder.mkdir()
    (folder / "gemma.yaml").write_text(
        "model: google/gemma-4-E2B-it\nprofile: l4\ntarget: production\n"
        "schedule: {warm_from: '06:00', warm_until: '18:00', days: mon-fri, timezone: America/Chicago}\n"
    )
    entries = yaml.safe_load(
        model_deployments(folder / "gemma.yaml", relative_to=tmp_path).replace("*pipeline_pool", "x")
    )
    promote, hours = entries
    assert promote["parameters"] == {"spec_file": "deployments/gemma.yaml"}
    assert hours["parameters"] == {"service": "google-gemma-4-e2b-it", "target": "production", "min_instances": 0}
    first = hours["schedules"][0]
    assert (first["cron"], first["timezone"]) == ("0 6 * * 1-5", "America/Chicago")


def test_a_model_file_with_bad_hours_is_named(tmp_path):
    (tmp_path / "chat.yaml").write_text("model: a/b\nschedule: {timezone: CEST}\n")
    with pytest.raises(ValueError, match=r"chat\.yaml: schedule\.timezone: 'CEST' is not an IANA time zone"):
        model_deployments(tmp_path / "chat.yaml", relative_to=tmp_path)


def test_only_the_scale_up_carries_the_end_of_its_warm_hours():
    assert [s.warm_until for s in WarmHours().schedules("chat")] == ["19:00", None, None]


@pytest.mark.parametrize(
    ("scheduled", "now", "late"),
    [
        ("2026-12-01T07:00:00+00:00", "2026-12-01T07:05:00+00:00", False),  # 08:00 Berlin, on time
        ("2026-12-01T07:00:00+00:00", "2026-12-01T17:59:00+00:00", False),  # late, but 18:59 Berlin: still warm hours
        ("2026-12-01T07:00:00+00:00", "2026-12-01T18:00:00+00:00", True),  # 19:00 Berlin: the day is over
        ("2026-12-01T07:00:00+00:00", "2026-12-02T01:00:00+00:00", True),  # the worker came back at 02:00
    ],
)
def test_a_late_scale_up_after_its_days_warm_hours_does_nothing(scheduled, now, late):
    why = late_scale_up(datetime.fromisoformat(scheduled), datetime.fromisoformat(now), "19:00", "Europe/Berlin")
    assert (why is not None) == late
    if late:
        assert why.startswith("this scale-up was due at 2026-12-01 08:00 Europe/Berlin") and "at night" in why
