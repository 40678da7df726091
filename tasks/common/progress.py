"""Byte progress for long transfers: a Prefect progress artifact in the UI and a log line every 10 percent."""

from __future__ import annotations

import re
import threading
import time

from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.context import get_run_context
from prefect.exceptions import MissingContextError

from tasks.common.logs import run_logger


def _in_run() -> bool:
    try:
        get_run_context()
    except MissingContextError:
        return False
    return True


def artifact_key(text: str) -> str:
    """Prefect artifact keys allow lowercase letters, digits and dashes only."""
    return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:100]


class ByteProgress:
    """Counts bytes from worker threads; ``report()`` (one thread) publishes what changed."""

    def __init__(self, total: int, done: int, key: str, what: str) -> None:
        self.total = max(total, 1)
        self.start_done = done
        self.done = done
        self.what = what
        self._lock = threading.Lock()
        self._started = time.monotonic()
        self._logged_decile = int(10 * done / self.total)
        self._published = -1.0
        self._artifact_id = None
        if _in_run():
            self._artifact_id = create_progress_artifact(
                progress=100 * done / self.total, key=artifact_key(key), description=what
            )

    def add(self, count: int) -> None:
        with self._lock:
            self.done += count

    @property
    def mb_per_s(self) -> float:
        elapsed = max(time.monotonic() - self._started, 1e-9)
        return (self.done - self.start_done) / elapsed / 1e6

    def report(self) -> None:
        percent = 100 * self.done / self.total
        decile = int(percent // 10)
        if decile > self._logged_decile:
            self._logged_decile = decile
            run_logger().info(
                "%s: %d%% (%.1f of %.1f MB) at %.1f MB/s",
                self.what,
                min(decile * 10, 100),
                self.done / 1e6,
                self.total / 1e6,
                self.mb_per_s,
            )
        # Whole percents, and always the end: a bar last published at 99.96 % must still reach 100 %.
        if self._artifact_id is not None and (percent - self._published >= 1 or percent >= 100 > self._published):
            update_progress_artifact(self._artifact_id, progress=percent)
            self._published = percent
