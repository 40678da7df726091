"""The sandbox's admin API (``/_sandbox``, sandbox/admin.py) refuses what it cannot honour, and faults must fire.

A fault rule or a setting with a misspelt key used to be accepted and ignored (``{"delay": 5}`` was a delay of 0 s),
so a test could pass without the fault it was written for. Requests go over real HTTP to the session sandbox.
"""

from __future__ import annotations

import httpx
import pytest

from sandbox.handle import SandboxHandle


def refused_fields(response: httpx.Response) -> dict[str, str]:
    """A 400 from the admin API: the message for each field it names."""
    assert response.status_code == 400, response.text
    return {".".join(map(str, error["loc"])): error["msg"] for error in response.json()["error"]}


def test_a_misspelt_fault_key_is_refused_naming_the_key_and_nothing_is_added(sb: SandboxHandle) -> None:
    refused = sb.admin.post("/faults", json={"server": "hub", "action": "delay", "delay": 5})
    assert refused_fields(refused) == {"delay": "Extra inputs are not permitted"}
    assert sb.faults() == []
    with pytest.raises(httpx.HTTPStatusError, match="delay"):  # the handle says which key, not just "400"
        sb.add_fault("hub", action="delay", delay=5)


def test_an_unknown_fault_server_is_refused_naming_the_known_ones(sb: SandboxHandle) -> None:
    message = refused_fields(sb.admin.post("/faults", json={"server": "hubb", "status": 429}))["server"]
    assert "'hubb'" in message
    for known in ("cdn", "control", "gcs", "hub", "metadata", "run:<service>[:<tag>]"):
        assert known in message
    assert "unknown server 'hubb'" in refused_fields(sb.admin.delete("/faults", params={"server": "hubb"}))["server"]
    assert refused_fields(sb.admin.post("/faults", json={"server": "run:Bad_Name", "status": 503})).keys() == {"server"}
    assert sb.faults() == []


def test_a_front_end_not_created_yet_may_be_named_and_posted_counts_are_the_sandboxs(sb: SandboxHandle) -> None:
    # A test may hold a candidate's /health before the promotion creates the candidate (tests/e2e/test_flows.py).
    rule = sb.add_fault(
        "run:admin-not-yet:candidate", path="^/health$", may_not_fire="only the name is checked: no such service"
    )
    assert rule["server"] == "run:admin-not-yet:candidate"
    counted = sb.admin.post("/faults", json={"server": "hub", "path": "^/admin-unused$", "id": 99, "fired": 7}).json()
    assert (counted["fired"], counted["id"]) == (0, rule["id"] + 1)  # a rule cannot arrive "already fired"


def test_the_check_reports_a_rule_that_never_fired_unless_it_may_not(sb: SandboxHandle) -> None:
    fired = sb.add_fault("hub", path="^/api/models/admin-check/fired$", status=418)
    cleared = sb.add_fault("hub", path="^/api/models/admin-check/cleared$", status=418)
    idle = sb.add_fault("hub", path="^/api/models/admin-check/idle$", status=418)
    sb.add_fault("hub", path="^/api/models/admin-check/excused$", status=418, may_not_fire="what this test checks")
    for name in ("fired", "cleared"):
        assert httpx.get(f"{sb.hub_url}/api/models/admin-check/{name}").status_code == 418
    sb.clear_faults("hub")  # what a rule fired before a clear in the test still counts
    assert [rule["id"] for rule in sb.take_unfired_faults()] == [idle["id"]]
    assert {fired["id"], cleared["id"]}.isdisjoint(rule["id"] for rule in sb.faults())
    assert sb.take_unfired_faults() == []  # checked once: the handle forgot them


def test_a_setting_the_running_sandbox_does_not_take_is_refused_naming_it(sb: SandboxHandle) -> None:
    before = sb.configure()
    assert refused_fields(sb.admin.post("/config", json={"time_scal": 0.5})) == {
        "time_scal": "Extra inputs are not permitted"
    }
    # Read once at start: changing it later would answer 200 and change nothing.
    assert refused_fields(sb.admin.post("/config", json={"project": "other"})).keys() == {"project"}
    # The bounds are SandboxConfig's own.
    assert refused_fields(sb.admin.post("/config", json={"time_scale": 0, "job_start_seconds": -1})).keys() == {
        "time_scale",
        "job_start_seconds",
    }
    assert refused_fields(sb.admin.post("/config", json={"caller": "sandbox-owner"})).keys() == {"caller"}
    assert sb.configure() == before
