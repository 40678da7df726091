"""An instance's output as Cloud Run's log agent receives it, and Cloud Run's own lines about the instance.

The container's stdout and stderr are two pipes the launcher reads on its event loop (``loop.add_reader``, no
thread per instance). Each complete line is appended to the revision's ``container.log`` (what the sandbox's admin
API and ``Instance.log_tail`` show) and, beside it, to ``container.log.lines``: one record per line, ``OFFSET
TIME_NS STREAM INSTANCE_ID``, where OFFSET is the line's byte offset in ``container.log``. Cloud Logging
(sandbox/control/logging/entries.py) gives each line that time and stream: a line arrives without a timestamp of its
own and "If this field is omitted in a new log entry, then Logging assigns it the current time" (LogEntry.timestamp,
Logging API v2 reference), and Cloud Run logs stdout and stderr as two logs, run.googleapis.com/stdout and /stderr
(Cloud Run docs, "Logging and viewing logs"). Times are the host's, strictly increasing within one instance.

A line is complete at its newline and stamped then; a ``\\r`` does not end one (tqdm's progress bars, which the real
engine prints on stderr, arrive as one line when their bar finishes). What is left without a newline when the pipe
closes (a container killed mid-line) is a line of its own; a line longer than ``MAX_LINE_BYTES`` is cut into lines of
that size (the sandbox's choice: how Cloud Run treats one is not modelled). The two pipes
are read independently, as the agent reads them: lines the container wrote to stdout and stderr within the same
moment may be stamped in either order.

Cloud Run's own lines about an instance go to ``system.log`` beside it, one JSON object a line (time, severity,
text, instance, container): entries.py serves them as ``run.googleapis.com/varlog/system`` ("platform-generated ...
written to varlog/system", Cloud Run docs, "Logging and viewing logs"). Before writing one, the launcher reads
whatever the container has written so far, so a probe's success is stamped after every line the container wrote
before it began to listen.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from pathlib import Path

LOG_FILE = "container.log"
RECORD_FILE = "container.log.lines"
SYSTEM_LOG_FILE = "system.log"
STREAMS = ("stdout", "stderr")
STEP_NS = 1_000  # two lines of one instance are at least 1 microsecond apart
# Cloud Logging's limit on one LogEntry is 256 KB (Cloud Logging quotas, "Size of a LogEntry"): a line is not held
# back longer than that.
MAX_LINE_BYTES = 256 * 1024
READ_BYTES = 65536


class ContainerLog:
    """One instance's container log: its pipes, the lines read from them and the records beside them."""

    def __init__(self, workdir: Path, instance_id: str, container_name: str) -> None:
        self.path = workdir / LOG_FILE
        self.records = workdir / RECORD_FILE
        self.system_path = workdir / SYSTEM_LOG_FILE
        self.instance_id = instance_id
        self.container_name = container_name
        self._last_ns = 0
        self._read_fds: dict[str, int] = {}  # stream -> our end of its pipe, while open
        self._write_fds: list[int] = []  # the container's ends, until it has them
        self._pending = {stream: bytearray() for stream in STREAMS}
        self._loop: asyncio.AbstractEventLoop | None = None

    # The container's pipes --------------------------------------------------------------------------------
    def open_pipes(self) -> tuple[int, int]:
        """Two pipes for the container's stdout and stderr; returns their write ends, to hand to the process."""
        for stream in STREAMS:
            read_fd, write_fd = os.pipe()
            os.set_blocking(read_fd, False)
            self._read_fds[stream] = read_fd
            self._write_fds.append(write_fd)
        return self._write_fds[0], self._write_fds[1]

    def attach(self) -> None:
        """The container has its ends: close ours of them and read the pipes on the running loop from now on."""
        self._close_write_ends()
        self._loop = asyncio.get_running_loop()
        for stream, fd in self._read_fds.items():
            self._loop.add_reader(fd, self._drain, stream)

    def pump(self) -> None:
        """Read now whatever the container has written so far (and not been read yet)."""
        for stream in list(self._read_fds):
            self._drain(stream)

    def close(self) -> None:
        """Read what is left, then stop reading: a line cut short is logged as it is. Idempotent."""
        self._close_write_ends()  # a launch that failed never handed them over
        self.pump()
        for stream in list(self._read_fds):
            self._close_stream(stream)

    def _close_write_ends(self) -> None:
        for fd in self._write_fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._write_fds.clear()

    def _drain(self, stream: str) -> None:
        fd = self._read_fds.get(stream)
        if fd is None:
            return
        while True:
            try:
                chunk = os.read(fd, READ_BYTES)
            except BlockingIOError:
                return
            except OSError:
                chunk = b""
            if not chunk:  # every writer has closed it: the container and what it started have exited
                self._close_stream(stream)
                return
            self._take(stream, chunk)

    def _take(self, stream: str, chunk: bytes) -> None:
        pending = self._pending[stream]
        pending += chunk
        *complete, rest = pending.split(b"\n")
        lines = [line[at : at + MAX_LINE_BYTES] for line in complete for at in range(0, len(line) or 1, MAX_LINE_BYTES)]
        while len(rest) > MAX_LINE_BYTES:
            lines.append(rest[:MAX_LINE_BYTES])
            rest = rest[MAX_LINE_BYTES:]
        self._pending[stream] = bytearray(rest)
        self._append(lines, stream)

    def _close_stream(self, stream: str) -> None:
        fd = self._read_fds.pop(stream, None)
        if fd is None:
            return
        if self._loop is not None:
            with contextlib.suppress(Exception):  # the loop may be closing
                self._loop.remove_reader(fd)
        with contextlib.suppress(OSError):
            os.close(fd)
        if self._pending[stream]:
            self._append([bytes(self._pending[stream])], stream)
            self._pending[stream].clear()

    # Writing ----------------------------------------------------------------------------------------------
    def _stamp(self) -> int:
        self._last_ns = max(time.time_ns(), self._last_ns + STEP_NS)
        return self._last_ns

    def _append(self, lines: list[bytes] | list[bytearray], stream: str) -> None:
        """Lines read now from ``stream``, each with its record, in one write to each file."""
        if not lines:
            return
        data = b"".join(bytes(line) + b"\n" for line in lines)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, data)
            # With O_APPEND the write went to the end, wherever that was: the offset after it tells where it began.
            offset = os.lseek(fd, 0, os.SEEK_CUR) - len(data)
        finally:
            os.close(fd)
        records = []
        for line in lines:
            records.append(f"{offset} {self._stamp()} {stream} {self.instance_id}\n")
            offset += len(line) + 1
        with self.records.open("a", encoding="ascii") as out:
            out.write("".join(records))

    def write(self, text: str, stream: str = "stdout") -> None:
        """One line in the container's log from beside it (the sandbox's notes, an in-process sidecar's output),
        stamped now; what the container wrote before it is read first."""
        self.pump()
        self._append([part.encode() for part in text.split("\n")], stream)

    def system(self, text: str, severity: str) -> None:
        """One of Cloud Run's own lines about this instance (varlog/system), stamped now, after what the container
        has written so far."""
        self.pump()
        record = {
            "t": self._stamp(),
            "severity": severity,
            "text": text,
            "instance": self.instance_id,
            "container": self.container_name,
        }
        with self.system_path.open("a", encoding="utf-8") as log:
            log.write(json.dumps(record) + "\n")
