"""Bad progressive-delivery settings (canary steps, the watch) and a canary the GPU quota cannot hold: refused with
the setting's path and the fix, before any cloud write."""

from __future__ import annotations

import pytest

from tests.support.bad_input import fails_cleanly, promote

pytestmark = pytest.mark.prefect


@pytest.mark.parametrize(
    ("kwargs", "field", "fix"),
    [
        pytest.param({"canary": [50, 10]}, "canary[1]", "rising order", id="canary-falling"),
        pytest.param({"canary": [10, 100]}, "canary[1]", "whole percentage from 1 to 99", id="canary-100"),
        pytest.param({"canary": [0]}, "canary[0]", "whole percentage from 1 to 99", id="canary-0"),
        pytest.param({"canary": [10], "watch": {"samples": 0}}, "canary", "set watch.samples", id="canary-unwatched"),
        pytest.param({"watch": {"max_error_ratio": 2}}, "max_error_ratio", "less than or equal to 1", id="ratio"),
    ],
)
def test_bad_delivery_settings_are_refused_before_any_cloud_write(sb, flow_env, kwargs, field, fix):
    fails_cleanly(sb, lambda: promote(**kwargs), field, fix)


@pytest.mark.usefixtures("raised_quota")  # an RTX instance (80 GiB) fits no new project's 40 GiB: the GPU is tested
def test_a_canary_the_gpu_quota_cannot_hold_is_refused_in_preflight(sb, flow_env):
    # A project with memory for RTX Pro 6000 instances but 1 such GPU per region, the common case: the candidate cannot
    # run beside the serving revision. (raised_quota puts the GPU quota back as it found it.)
    sb.configure(gpu_quota={**sb.configure()["gpu_quota"], "nvidia-rtx-pro-6000": 1})
    message = fails_cleanly(
        sb, lambda: promote(profile="rtx-pro-6000", canary=[10, 50], watch={"samples": 2}), "canary",
        "leave canary empty",
    )  # fmt: skip
    assert "2 nvidia-rtx-pro-6000 GPUs" in message and "quota of 1" in message


def test_the_canary_quota_is_the_project_s_not_the_profile_s(sb, flow_env):
    # The profile believes in the default L4 quota of 3; the project has 1: the live quota decides.
    before = sb.configure()["gpu_quota"]
    sb.configure(gpu_quota={**before, "nvidia-l4": 1})
    try:
        message = fails_cleanly(
            sb, lambda: promote(profile="l4", canary=[25], watch={"samples": 2}), "canary", "request more quota"
        )
    finally:
        sb.configure(gpu_quota=before)
    assert "quota of 1" in message
