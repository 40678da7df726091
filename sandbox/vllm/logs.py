"""Log lines shaped like vLLM's, on stdout, so the container log reads like the real one.

vLLM prefixes each line with the process (``APIServer`` or ``EngineCore_DP0``), level, time and source
location. Durations in these lines are simulated seconds: tests and the Cloud Run stand-in compare them
instead of wall-clock time. Lines the real vLLM would not print are marked ``[sandbox]``.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import TextIO

API_SERVER = "APIServer"
ENGINE_CORE = "EngineCore_DP0"


class VllmLog:
    """Writes vLLM-style lines; thread-safe because request threads log access lines concurrently."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream or sys.stdout
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def _emit(self, line: str) -> None:
        with self._lock:
            self._stream.write(line + "\n")
            self._stream.flush()

    def log(self, level: str, source: str, message: str, process: str = API_SERVER) -> None:
        """One line: ``(APIServer pid=N) INFO 10-06 12:00:41 [api_server.py:1971] message``.

        An empty ``process`` drops the prefix, as for lines vLLM prints before its API server process starts.
        """
        stamp = time.strftime("%m-%d %H:%M:%S")
        prefix = f"({process} pid={self._pid}) " if process else ""
        self._emit(f"{prefix}{level} {stamp} [{source}] {message}")

    def info(self, source: str, message: str, process: str = API_SERVER) -> None:
        """An INFO line."""
        self.log("INFO", source, message, process)

    def warning(self, source: str, message: str, process: str = API_SERVER) -> None:
        """A WARNING line."""
        self.log("WARNING", source, message, process)

    def error(self, source: str, message: str, process: str = API_SERVER) -> None:
        """An ERROR line."""
        self.log("ERROR", source, message, process)

    def uvicorn(self, message: str) -> None:
        """A uvicorn line (``INFO:     message``), as vLLM's HTTP server prints them."""
        self._emit(f"({API_SERVER} pid={self._pid}) INFO:     {message}")

    def sandbox(self, message: str) -> None:
        """A note from the sandbox itself: what the real container would not say but a reader needs."""
        self._emit(f"[sandbox] {message}")
