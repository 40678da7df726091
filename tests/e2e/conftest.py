"""End-to-end fixtures: flows against the sandbox under the session's Prefect harness (``flow_env`` is
tests/support/flow_env.py's, shared with the other tiers that run flows)."""

from __future__ import annotations

import pytest
from prefect.testing.fixtures import asserting_events_worker  # noqa: F401  (a pytest fixture)

USERS_VISIBLE = 10  # the watch's default min_requests, the most any test asks for


@pytest.fixture
def traffic(flow_env):
    """Start a background client (sandbox.traffic.Traffic; ``options`` such as stream=True) on a service that already
    serves; stop it at the end of the test."""
    import threading

    from sandbox.traffic import Traffic
    from tasks.common import clients
    from tasks.deploy.cloudrun import serving_traffic
    from tasks.watch.canary import served_requests
    from tests.support.locks import wait_until

    started: list[tuple[Traffic, threading.Thread]] = []

    def start(service: str, **options) -> Traffic:
        url = clients.run_services(flow_env).get_service(name=f"{flow_env.location_path}/services/{service}").uri
        client = Traffic(url, clients.identity_token(flow_env, url).get_secret_value(), **options)
        thread = threading.Thread(target=client.run, daemon=True)
        thread.start()
        started.append((client, thread))
        # A service with users: their requests are in Cloud Monitoring (a period shows up to its delay after it ends)
        # before the test promotes, as a real service's are; the promotion's watch reads them to decide it can judge.
        serving = serving_traffic(flow_env, service)
        visible = 20 * flow_env.metrics_sample_seconds + flow_env.metrics_delay_seconds
        wait_until(lambda: (served_requests(flow_env, service, serving, visible) or 0) >= USERS_VISIBLE, 120,
                   f"{USERS_VISIBLE} requests of {service}'s users in Cloud Monitoring")  # fmt: skip
        return client

    yield start
    for client, thread in started:
        client.stop.set()
        thread.join(timeout=60)
