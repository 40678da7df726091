"""The deployments' parameters are described in the UI, and a run's outcome is rendered as the run says it.

Prefect shows each parameter's description from the flow function's Google-style ``Args:`` section: its
``parameter_schema`` parses the docstring (prefect/utilities/callables ``parameter_docstrings``, griffe's Google
parser) into the OpenAPI schema a deployment carries.
"""

from __future__ import annotations

import inspect

import pytest
from prefect.utilities.callables import parameter_schema

from blocks.target import GcpTarget
from flows.promote import promote_model
from flows.rollback import rollback_model
from flows.scale import scale_service
from flows.teardown import teardown
from tasks.report.outcome import ServiceState, rollback_outcome, scale_outcome, skipped_scale
from tasks.report.schedules import hours_deployment, promote_command

FLOWS = [scale_service, rollback_model, teardown, promote_model]
TARGET = GcpTarget(project="my-project", region="europe-west4")


@pytest.mark.parametrize("flow", FLOWS, ids=lambda f: f.name)
def test_every_parameter_of_the_deployed_flows_has_a_description(flow):
    schema = parameter_schema(flow.fn)
    names = list(inspect.signature(flow.fn).parameters)
    assert sorted(schema.properties) == sorted(names)
    undescribed = [name for name in names if not (schema.properties[name].get("description") or "").strip()]
    assert undescribed == [], f"{flow.name}: add these to the docstring's Args: section"


def test_a_description_is_the_whole_entry_continuation_lines_included():
    described = parameter_schema(scale_service.fn).properties["warm_until"]["description"]
    assert described.startswith("HH:MM in `timezone`") and described.endswith("so no GPU starts at night.")


def state(**changes) -> ServiceState:
    values = {"service": "chat", "url": "https://chat-x.run.app", "traffic": [("chat-b", 100)], "min_instances": 0,
              "max_instances": None, **changes}  # fmt: skip
    return ServiceState(**values)


def test_a_scale_outcome_says_min_and_max_before_and_after_and_what_serves_where():
    outcome = scale_outcome(TARGET, state(), 1, 2, changed=True)
    assert (
        outcome.line
        == "scale chat: min 0 -> 1, max not set -> 2 (changed); traffic chat-b 100 %, url https://chat-x.run.app"
    )
    assert outcome.key == "scale-chat"
    text = outcome.markdown()
    rows = [
        "| service | chat (my-project/europe-west4) |",
        "| serving revision | chat-b |",
        "| min instances | 0 -> 1 |",
        "| max instances | not set -> 2 |",
        "| changed | yes |",
        outcome.line,
    ]
    for row in rows:
        assert row in text
    unchanged = scale_outcome(TARGET, state(min_instances=1, traffic=[("b", 90), ("a", 10)]), 1, None, changed=False)
    assert unchanged.line.startswith("scale chat: min 1, max not set (no change); traffic b 90 %, a 10 %,")


def test_a_rollback_outcome_says_where_traffic_went_and_from_where():
    outcome = rollback_outcome(TARGET, "chat", state(traffic=[("chat-a", 100)]), "chat-b", "chat-a")
    assert outcome.line == "rollback chat: traffic 100 % -> chat-a (was chat-b), url https://chat-x.run.app"
    assert ("rolled back from", "chat-b (recorded as rolled back)") in outcome.facts
    assert outcome.key == "rollback-chat"
    split = rollback_outcome(TARGET, "chat", state(traffic=[("chat-a", 50), ("chat-b", 50)]), "chat-b", "chat-a")
    assert "traffic now chat-a 50 %, chat-b 50 % (was chat-b)" in split.line  # Cloud Run's word, not the request


def test_a_skipped_scale_says_why_and_the_model_files_promotion():
    assert promote_command(hours_deployment("gemma-4-31b"), "gemma-4-31b") == (
        "prefect deployment run promote-model/gemma-4-31b"
    )
    assert "promote-model/promote -p model=ORG/NAME -p service=chat" in promote_command("scale", "chat")
    assert promote_command(None, "chat").endswith("-p service=chat")
    assert skipped_scale("Chat_1", "not promoted yet").key == "scale-chat-1"  # keys: lowercase, digits, dashes
