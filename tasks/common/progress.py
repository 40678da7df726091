"""Byte progress for long transfers: a Prefect progress artifact in the UI and a log line every 10 percent."""

from __future__ import annotations

import re
import threading
import time

from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.context import get_run_context
from prefect.exceptions import MissingContextError

from tasks.common.logs import run_logger

# Each update of the progress bar is one API request (PATCH /artifacts/{id}): a staging fast enough to cross a whole
# percent at every 0.5 s tick would make 120 a minute, half of Prefect Cloud Hobby's 250 ("Rate limits and data
# retention", https://docs.prefect.io/v3/concepts/rate-limits). At most one every 5 s: 12 a minute, and the end.
PUBLISH_EVERY_S = 5.0


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
        self._published_at = -PUBLISH_EVERY_S
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
        # Whole percents at most every PUBLISH_EVERY_S, and always the end: a bar last published at 99.96 % must still
        # reach 100 %.
        now = time.monotonic()
        due = percent - self._published >= 1 and now - self._published_at >= PUBLISH_EVERY_S
        if self._artifact_id is not None and (due or percent >= 100 > self._published):
            update_progress_artifact(self._artifact_id, progress=percent)
            self._published, self._published_at = percent, now
