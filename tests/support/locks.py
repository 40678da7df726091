"""Reading the per-service lock as the Prefect server counts it, and waiting on a condition without sleeping in
an assertion."""

from __future__ import annotations

import time
from collections.abc import Callable

from prefect.client.orchestration import SyncPrefectClient, get_client
from prefect.exceptions import ObjectNotFound

from flows.common import service_lock_name


def lock_slots(target, service: str, client: SyncPrefectClient | None = None) -> int:
    """Slots taken on the service's lock (flows.common.service_lock); 0 when it was never created."""
    with client or get_client(sync_client=True) as api:
        try:
            return api.read_global_concurrency_limit_by_name(service_lock_name(target, service)).active_slots
        except ObjectNotFound:
            return 0


def wait_until(condition: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {seconds} s waiting for {what}"
        time.sleep(0.02)
