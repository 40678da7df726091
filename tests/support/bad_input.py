"""What the bad-input catalogue (tests/reliability/test_bad_input*.py, issue 8) shares: promote-model as a user
starts it, and the judgement that a bad input fails cleanly, naming the field and saying what to do, before any
cloud write (POST/PUT/PATCH/DELETE on the control plane or GCS)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path

from blocks import GcpTarget, ServingProfile
from flows.promote import promote_model
from tests.support.delivery import NO_WATCH
from tests.support.promotion import FAST

WRITES = {"POST", "PUT", "PATCH", "DELETE"}
CLOUD = {"control", "gcs"}
ROOT = Path(__file__).resolve().parents[2]  # the project folder
_ids = itertools.count()


def cloud_writes(sb, since: int) -> list[str]:
    return [
        f"{r['server']} {r['method']} {r['path']}"
        for r in sb.requests(since=since)
        if r["method"] in WRITES and r["server"] in CLOUD
    ]


def failure(call: Callable[[], object]) -> str:
    """The message of the error ``call`` raises; an AssertionError when it is accepted."""
    try:
        call()
    except Exception as exc:  # any error type: its message is what is judged
        return str(exc)
    raise AssertionError("the bad input was accepted without an error")


def fails_cleanly(sb, call: Callable[[], object], field: str, fix: str) -> str:
    """``call`` fails with a message naming ``field`` and saying ``fix``, before any cloud write."""
    since = sb.last_request_seq()
    message = failure(call)
    assert field in message, f"the message does not name {field!r}: {message}"
    assert fix in message, f"the message does not say what to do ({fix!r}): {message}"
    assert cloud_writes(sb, since) == [], f"cloud writes before the error: {cloud_writes(sb, since)}"
    return message


def new_service() -> str:
    return f"bi-{next(_ids)}"


def promote(**kwargs):
    """promote-model as a user starts it, with one service per call."""
    params = {
        "model": "sandbox/tiny-chat",
        "service": new_service(),
        "token_secret_block": "sandbox-hf-token",
        "verify": FAST,
        "watch": NO_WATCH,
        **kwargs,
    }
    return promote_model(**params)


def saved_profile(name: str, preset: str = "l4", **overrides) -> str:
    ServingProfile.preset(preset, **overrides).save(name, overwrite=True)
    return name


def saved_target(flow_env: GcpTarget, name: str, **changes) -> str:
    GcpTarget.model_validate({**flow_env.model_dump(), **changes}).save(name, overwrite=True)
    return name


def new_repo(sb, name: str) -> str:
    """A small public repo of our own, so staging it always has something to upload."""
    repo_id = f"badinput/{name}-{next(_ids)}"
    spec = {"weight_bytes": 200_000, "shards": 1, "include_bin_duplicate": False, "include_original": False}
    sb.hub("POST", "/repos", json={"repo_id": repo_id, **spec})
    return repo_id
