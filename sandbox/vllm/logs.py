"""Log lines shaped like vLLM's, on the streams vLLM writes them to, so the container log reads like the real one.

vLLM (0.32.0, vllm/logger.py:28-31) prefixes each line with the process (``APIServer``, ``EngineCore`` or ``Worker``),
level, time and source location, and logs to stdout (vllm/envs.py ``VLLM_LOGGING_STREAM``, default
``ext://sys.stdout``). uvicorn's own lines carry no such prefix: its lifecycle lines ("Started server process [N]",
"Application startup complete.") go to stderr (logger ``uvicorn.error``), its access lines to stdout (logger
``uvicorn.access``; uvicorn/config.py LOGGING_CONFIG). Durations in these lines are simulated seconds: tests and the
Cloud Run stand-in compare them instead of wall-clock time. Lines the real vLLM would not print are marked
``[sandbox]``.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from typing import TextIO

API_SERVER = "APIServer"
ENGINE_CORE = "EngineCore"
WORKER = "Worker"
UVICORN_INFO = "INFO:     "  # uvicorn's default formatter: the level name, padded


class VllmLog:
    """Writes vLLM-style lines; thread-safe because request threads log access lines concurrently."""

    def __init__(self, stream: TextIO | None = None, err_stream: TextIO | None = None) -> None:
        self._stream = stream or sys.stdout
        self._err_stream = err_stream or sys.stderr
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def _emit(self, line: str, stream: TextIO | None = None) -> None:
        out = stream or self._stream
        with self._lock:
            out.write(line + "\n")
            out.flush()

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
        """A uvicorn lifecycle line (``INFO:     message``), on stderr."""
        self._emit(f"{UVICORN_INFO}{message}", self._err_stream)

    def access(self, message: str) -> None:
        """A uvicorn access line (``INFO:     127.0.0.1:5 - "GET /health HTTP/1.1" 200 OK``), on stdout."""
        self._emit(f"{UVICORN_INFO}{message}")

    def streamer(self, message: str) -> None:
        """A Run:ai model streamer line, as its stderr handler writes it: ``2026-12-04 12:40:01,123 [INFO] message``."""
        now = time.time()
        stamp = f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(now))},{int(now % 1 * 1000):03d}"
        self._emit(f"{stamp} [INFO] {message}", self._err_stream)

    def sandbox(self, message: str) -> None:
        """A note from the sandbox itself: what the real container would not say but a reader needs."""
        self._emit(f"[sandbox] {message}")


def binary_size(size: float) -> str:
    """A size as ``humanize.naturalsize(size, binary=True)`` writes it: "2.8 MiB", "1.0 GiB", "512 Bytes"."""
    if size < 1024:
        return f"{int(size)} Bytes"
    units = ("KiB", "MiB", "GiB", "TiB")
    power = min(int(math.log(size, 1024)), len(units))
    return f"{size / 1024**power:.1f} {units[power - 1]}"
