"""Validation errors name the field by the path a user writes (issue 14): `vllm.max_model_len`, `schedule.days`,
`allow_patterns[0]`, with the fix, and never the value typed (it may be a pasted token)."""

from __future__ import annotations

import pytest

from blocks import ImageBuild, ServingProfile
from flows.common import ModelSpec, field_path, validated
from tasks.report.schedules import WarmHours


@pytest.mark.parametrize(
    ("loc", "prefix", "path"),
    [
        (("vllm", "max_model_len"), "", "vllm.max_model_len"),
        (("allow_patterns", 0), "", "allow_patterns[0]"),
        (("vllm", "extra_args", 2), "", "vllm.extra_args[2]"),
        (("warm_from",), "schedule", "schedule.warm_from"),
        ((), "build", "build"),
    ],
)
def test_field_path(loc, prefix, path):
    assert field_path(loc, prefix) == path


def refusal(model, data, prefix: str = "") -> str:
    with pytest.raises(ValueError) as caught:
        validated(model, data, prefix)
    return str(caught.value)


def test_pydantic_messages_are_led_by_the_full_path():
    message = refusal(ServingProfile, {"vllm": {"max_model_len": 8, "max_num_seqs": 0}})
    assert "vllm.max_model_len: Input should be greater than or equal to 16" in message
    assert "vllm.max_num_seqs: Input should be greater than or equal to 1" in message


def test_our_own_messages_are_kept_as_they_are():
    message = refusal(ServingProfile, {"vllm": {"extra_args": ["--port", "8000"]}})
    assert message.startswith("vllm.extra_args: '--port' is rendered from container_port")
    assert refusal(WarmHours, {"days": "Mon-Fry"}, "schedule").startswith("schedule.days: 'Mon-Fry'")


def test_a_prefix_places_a_sub_model_in_its_file():
    assert refusal(WarmHours, {"warm_until": [19]}, "schedule").startswith("schedule.warm_until: Input should be")


@pytest.mark.parametrize(
    ("model", "data", "expected", "allowed"),
    [
        (ServingProfile, {"vllm": {"max_model_lenn": 1}}, "vllm.max_model_lenn: unknown key 'max_model_lenn'",
         "'max_model_len'"),
        (ServingProfile, {"build": {"recipe": "vllm-cpu", "gti_url": "x"}, "image": None},
         "build.gti_url: unknown key 'gti_url'", "'git_url'"),
        (ModelSpec, {"schedule": {"warm_form": "07:00"}}, "schedule.warm_form: unknown key 'warm_form'",
         "'warm_from'"),
        (ModelSpec, {"services": "x"}, "services: unknown key 'services'", "'service'"),
        (ImageBuild, {"recipe": "vllm-cpu", "args": {}}, "args: unknown key 'args'", "'build_args'"),
    ],
)  # fmt: skip
def test_unknown_keys_are_named_with_the_keys_allowed_there(model, data, expected, allowed):
    message = refusal(model, data)
    assert expected in message and "allowed:" in message and allowed in message


def test_the_value_typed_is_never_in_the_message():
    secret = "hf_SECRETsecretSECRET"
    for data in ({"cpu": secret}, {"vllm": {"max_num_seqs": secret}}, {"gpu_type": secret}, {"env": {"A": [secret]}}):
        assert secret not in refusal(ServingProfile, data)
    assert secret not in refusal(ModelSpec, {"allow_patterns": [secret, 1], "build": {"recipe": "x", "y": secret}})
