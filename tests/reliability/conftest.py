"""Reliability fixtures: Prefect's events worker; `flow_env` (sandbox blocks saved, Hub stand-in as HF_ENDPOINT) is
every tier's, from tests/support/flow_env.py."""

from __future__ import annotations

from prefect.testing.fixtures import asserting_events_worker  # noqa: F401  (a pytest fixture)
