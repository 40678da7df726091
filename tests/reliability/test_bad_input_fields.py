"""Every refusal names the field by its full path and says the fix (issue 14, section 3).

Saved blocks as the UI's JSON editor can leave them, model files in deployments/, and the scale-service and
rollback-model parameters, each run through the flow a user starts against the sandbox; and a report that says
"traffic unknown" when reading where traffic stands is refused (403), instead of "no traffic".
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import yaml
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import BlockDocumentUpdate

from blocks import ServingProfile
from flows.rollback import rollback_model
from flows.scale import scale_service
from flows.sync_deployments import model_deployments
from flows.teardown import teardown
from tasks.common import clients
from tasks.deploy.cloudrun import service_path
from tests.support.artifacts import artifact
from tests.support.bad_input import ROOT, fails_cleanly, new_service, promote
from tests.support.sandbox_config import sandbox_settings

pytestmark = pytest.mark.prefect
TINY_CHAT = yaml.safe_load((ROOT / "deployments" / "sandbox" / "tiny-chat.yaml").read_text())


# Saved blocks as the UI's JSON editor leaves them ---------------------------------------------------------------
def edited_profile(name: str, change) -> str:
    """An l4 ServingProfile saved, then its document edited as the UI's JSON editor does (no validation)."""
    ServingProfile.preset("l4").save(name, overwrite=True)

    async def edit():
        async with get_client() as client:
            document = await client.read_block_document_by_name(name, ServingProfile.get_block_type_slug())
            data = change(dict(document.data))
            await client.update_block_document(document.id, BlockDocumentUpdate(data=data, merge_existing_data=False))

    asyncio.run(edit())
    return name


def _vllm(**values):
    return lambda data: {**data, "vllm": {**data["vllm"], **values}}


@pytest.mark.parametrize(
    ("change", "field", "fix"),
    [
        pytest.param(_vllm(max_num_seqs=0), "vllm.max_num_seqs: ", "greater than or equal to 1", id="nested-range"),
        pytest.param(_vllm(max_model_len="long"), "vllm.max_model_len: ", "valid integer", id="nested-type"),
        pytest.param(
            _vllm(max_model_lenn=4096),
            "vllm.max_model_lenn: unknown key 'max_model_lenn'",
            "'max_model_len'",
            id="nested-unknown-key",
        ),
        pytest.param(lambda d: {**d, "cpu": "eight"}, "cpu: ", "valid integer", id="top-type"),
        pytest.param(
            lambda d: {**d, "max_instance": 2}, "unknown key 'max_instance'", "'max_instances'", id="top-unknown-key"
        ),
        pytest.param(_vllm(extra_args=["--seed", 7]), "vllm.extra_args[1]: ", "valid string", id="list-item-type"),
    ],
)
def test_saved_profile_edited_in_the_ui_names_the_path(sb, flow_env, change, field, fix):
    profile = edited_profile(f"bf-ui-{new_service()}", change)
    message = fails_cleanly(sb, lambda: promote(profile=profile), field, fix)
    assert f"'{profile}'" in message and "Fix it in the UI" in message


def test_a_value_typed_where_a_number_belongs_is_not_echoed(sb, flow_env):
    # A token pasted into the wrong field of the JSON editor must not come back in the error (and the run's logs).
    profile = edited_profile("bf-ui-pasted-token", _vllm(max_num_seqs="hf_pastedTOKENvalue123"))
    message = fails_cleanly(sb, lambda: promote(profile=profile), "vllm.max_num_seqs", "valid integer")
    assert "hf_pastedTOKENvalue123" not in message


# Model files ------------------------------------------------------------------------------------------------------
@pytest.fixture
def project(tmp_path, monkeypatch) -> Path:
    """A project folder with a deployments/ folder, as the run's working directory (the pull step's chdir)."""
    (tmp_path / "deployments").mkdir()
    monkeypatch.chdir(tmp_path)
    return tmp_path


def model_file(project: Path, text: str, name: str = "chat.yaml") -> str:
    (project / "deployments" / name).write_text(text)
    return f"deployments/{name}"


def from_file(spec_file: str, **params):
    return promote(model=None, service=None, spec_file=spec_file, dry_run=True, **params)


def test_a_model_file_in_deployments_is_read(sb, flow_env, project):
    spec = model_file(project, yaml.safe_dump({**TINY_CHAT, "target": "production", "service": new_service()}))
    assert from_file(spec).outcome == "dry-run"


def test_yaml_syntax_error_names_the_file_and_line(sb, flow_env, project):
    spec = model_file(project, "model: sandbox/tiny-chat\nprofile: l4\n  service: x: y\n")
    message = fails_cleanly(sb, lambda: from_file(spec), f"spec_file {spec}, line 3", "fix the file")
    assert "not valid YAML" in message


@pytest.mark.parametrize("text", ["sandbox/tiny-chat\n", "- model: sandbox/tiny-chat\n"], ids=["scalar", "list"])
def test_a_model_file_that_is_not_a_mapping(sb, flow_env, project, text):
    spec = model_file(project, text)
    fails_cleanly(sb, lambda: from_file(spec), f"{spec}: holds a", "write `key: value` lines")


@pytest.mark.parametrize(
    ("extra", "field", "fix"),
    [
        pytest.param(
            {"schedule": {**TINY_CHAT["schedule"], "warm_form": "07:00"}},
            "schedule.warm_form: unknown key 'warm_form'",
            "'warm_from'",
            id="schedule",
        ),
        pytest.param(
            {"build": {"recipe": "serve-wrapper", "base_imag": "hf_notEchoedValue"}},
            "build.base_imag: unknown key 'base_imag'",
            "'base_image'",
            id="build",
        ),
        pytest.param(
            {"schedule": {**TINY_CHAT["schedule"], "warm_from": ["08:00"]}},
            "schedule.warm_from: ",
            "valid time",
            id="schedule-type",
        ),
        pytest.param({"allow_patterns": [".safetensors", 3]}, "allow_patterns[1]: ", "valid string", id="list-item"),
    ],
)
def test_a_model_file_names_the_bad_key_at_any_depth(sb, flow_env, project, extra, field, fix):
    spec = model_file(project, yaml.safe_dump({**TINY_CHAT, "target": "production", **extra}))
    message = fails_cleanly(sb, lambda: from_file(spec), f"{spec}: ", fix)
    assert field in message, message
    assert "hf_notEchoedValue" not in message


def test_spec_file_outside_deployments(sb, flow_env, project):
    (project / "outside.yaml").write_text(yaml.safe_dump({**TINY_CHAT, "target": "production"}))
    for path in ("outside.yaml", "deployments/../outside.yaml", str(project / "outside.yaml")):
        fails_cleanly(sb, lambda p=path: from_file(p), f"spec_file: {path} is not inside", "deployments/")


def test_spec_file_linked_from_deployments_to_outside(sb, flow_env, project):
    (project / "outside.yaml").write_text(yaml.safe_dump({**TINY_CHAT, "target": "production"}))
    (project / "deployments" / "linked.yaml").symlink_to(project / "outside.yaml")
    fails_cleanly(sb, lambda: from_file("deployments/linked.yaml"), "spec_file: deployments/linked.yaml", "not inside")


def test_the_sandbox_model_file_is_inside_deployments(sb, flow_env, monkeypatch):
    monkeypatch.chdir(ROOT)
    report = promote(
        model=None, service=new_service(), target="production", spec_file="deployments/sandbox/tiny-chat.yaml",
        dry_run=True,
    )  # fmt: skip
    assert report.outcome == "dry-run" and report.model == "sandbox/tiny-chat"


# scale-service and rollback-model ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def served(flow_env):
    """One promoted l4 service for the cases below; torn down afterwards."""
    service = new_service()
    promote(service=service)
    yield service
    teardown(service=service)


def test_scale_above_the_gpu_quota(sb, served):
    fails_cleanly(
        sb,
        lambda: scale_service(service=served, min_instances=0, max_instances=5),
        "max_instances: 5 instances",
        "set max_instances to 3 or fewer",
    )


def test_scale_above_the_default_quota_with_a_raised_one(sb, served):
    # The quota Service Usage reports decides (tasks/checks/quotas.py): a raised one needs no gpu_quota passed.
    with sandbox_settings(sb, gpu_quota={**sb.configure()["gpu_quota"], "nvidia-l4": 8}):
        result = scale_service(service=served, min_instances=0, max_instances=4)
    assert result.max_instances == 4
    scale_service(service=served, min_instances=0, max_instances=1)


def serving_revision(target, service: str) -> str:
    current = clients.run_services(target).get_service(name=service_path(target, service))
    return next(s.revision for s in current.traffic_statuses if s.percent == 100)


def test_rollback_to_a_revision_that_does_not_exist(sb, flow_env, served):
    revision = serving_revision(flow_env, served)
    message = fails_cleanly(
        sb, lambda: rollback_model(service=served, to_revision=f"{served}-nope"), "to_revision", "Give one of these"
    )
    assert f"no revision '{served}-nope'" in message and revision in message  # the revisions that do exist


def test_rollback_of_a_service_that_does_not_exist(sb, flow_env):
    fails_cleanly(
        sb,
        lambda: rollback_model(service="bf-nope", to_revision="x"),
        "no Cloud Run service 'bf-nope'",
        "promote-model",
    )


# Where traffic stands, when it cannot be read ------------------------------------------------------------------
def test_a_403_reading_traffic_is_said_not_reported_as_no_traffic(sb, flow_env, served):
    with sb.caller_roles([]):  # the caller may not even read the service
        message = fails_cleanly(sb, lambda: promote(service=served, load_mode="gcs"), "load_mode", "gcs-volume")
    report = artifact(f"promotion-{served}")
    assert "no traffic" not in report, report
    assert "| traffic now | unknown: reading " in report and "permission denied" in report, report
    assert "gcs-volume" in message


# Replacements for test_bad_input.py's model-file cases, whose files lay in tmp_path (outside deployments/, now
# refused): the same inputs and assertions, with the file inside the project's deployments/ folder.
def test_spec_file_with_an_unknown_key(sb, flow_env, project):
    spec = model_file(project, "model: sandbox/tiny-chat\nservices: bi-spec\nprofile: l4\n", "tiny-chat.yaml")
    message = fails_cleanly(sb, lambda: promote(model=None, service=None, spec_file=spec), "'services'", "allowed:")
    assert "'service'" in message  # the list of allowed keys shows the right spelling


@pytest.mark.parametrize(
    ("schedule", "field", "fix"),
    [
        pytest.param({"days": "Mon-Fry"}, "schedule.days", "write e.g. mon-fri", id="days-typo"),
        pytest.param({"warm_from": "25:00"}, "schedule.warm_from", "write HH:MM", id="hour-25"),
        pytest.param({"warm_from": "8am weekdays"}, "schedule.warm_from", "write HH:MM", id="prose"),
        pytest.param({"warm_until": "07:00"}, "schedule.warm_until", "after warm_from", id="until-before-from"),
        pytest.param({"timezone": "CEST"}, "schedule.timezone", "Europe/Berlin", id="tz-abbreviation"),
        pytest.param({"timezone": "Europe/Berlinn"}, "schedule.timezone", "IANA", id="tz-typo"),
    ],
)
def test_business_hours_in_a_model_file(sb, flow_env, project, schedule, field, fix):
    spec = model_file(project, yaml.safe_dump({**TINY_CHAT, "schedule": {**TINY_CHAT["schedule"], **schedule}}))
    fails_cleanly(sb, lambda: promote(spec_file=spec, model=None), field, fix)  # the promotion prices by them
    path = project / spec
    fails_cleanly(sb, lambda: model_deployments(path, relative_to=project), field, fix)  # and prefect.yaml has them
