"""The run logs of flows called in the test's process, as Prefect's run loggers emit them."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

RUN_LOGGERS = ("prefect.flow_runs", "prefect.task_runs")


class RunLog(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []
        self.errors: list[str] = []  # ERROR and above: a successful run has none

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())
        if record.levelno >= logging.ERROR:
            self.errors.append(record.getMessage())

    def text(self) -> str:
        return "\n".join(self.lines)


@contextmanager
def run_logs() -> Iterator[RunLog]:
    handler = RunLog()
    loggers = [logging.getLogger(name) for name in RUN_LOGGERS]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        yield handler
    finally:
        for logger in loggers:
            logger.removeHandler(handler)
