"""Loggers: the Prefect run logger inside a flow or task (it reaches the UI), the package logger elsewhere."""

from __future__ import annotations

import logging

from prefect.exceptions import MissingContextError
from prefect.logging import get_run_logger

PACKAGE_LOGGER = "hf_cloudrun"


def run_logger() -> logging.Logger | logging.LoggerAdapter:
    try:
        return get_run_logger()
    except MissingContextError:
        return logging.getLogger(PACKAGE_LOGGER)
