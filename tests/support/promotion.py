"""promote-model as the end-to-end tests run it (in-process, on the sandbox's tiny chat model), and the Cloud Run
service it leaves behind."""

from __future__ import annotations

from google.cloud import run_v2

from flows.promote import promote_model
from tasks.common import clients
from tasks.deploy.probe import VerifyOptions
from tests.support.delivery import NO_WATCH

FAST = VerifyOptions(health_period_s=0.05)


def promote(service: str, **kwargs):
    """promote-model with the post-promotion watch off unless ``watch=`` is given (tests of other steps)."""
    params = {"model": "sandbox/tiny-chat", "service": service, "token_secret_block": "sandbox-hf-token",
              "verify": FAST, "watch": NO_WATCH, **kwargs}  # fmt: skip
    return promote_model(**params)


def promote_watched(service: str, **kwargs):
    """promote-model with the flow's own watch settings unless ``watch=`` is given (tests of progressive delivery)."""
    params = {"model": "sandbox/tiny-chat", "service": service, "token_secret_block": "sandbox-hf-token",
              "verify": FAST, **kwargs}  # fmt: skip
    return promote_model(**params)


def run_service(target, service: str) -> run_v2.Service:
    """The Cloud Run service as the Admin API returns it."""
    return clients.run_services(target).get_service(name=f"{target.location_path}/services/{service}")
