"""Reliability fixtures: the end-to-end `flow_env` (sandbox blocks saved, Hub stand-in as HF_ENDPOINT)."""

from __future__ import annotations

from prefect.testing.fixtures import asserting_events_worker  # noqa: F401  (a pytest fixture)

from tests.e2e.conftest import flow_env  # noqa: F401  (a pytest fixture)
