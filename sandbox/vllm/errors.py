"""Start-up failures, printed the way a crashing vLLM prints them: a traceback ending in the real message."""

from __future__ import annotations

import sys
from typing import TextIO

_SITE = "/usr/local/lib/python3.12/dist-packages"


class VllmStartupError(Exception):
    """vLLM dies during start-up: ``exc_type: message`` is the traceback's last line, as in the field."""

    def __init__(
        self,
        exc_type: str,
        message: str,
        *,
        where: str = "vllm/entrypoints/cli/main.py",
        cause: VllmStartupError | None = None,
        exit_code: int = 1,
    ) -> None:
        super().__init__(f"{exc_type}: {message}")
        self.exc_type = exc_type
        self.message = message
        self.where = where
        self.cause = cause
        self.exit_code = exit_code

    def render(self) -> str:
        """The traceback text, causes first (as Python prints ``raise ... from``)."""
        parts: list[str] = []
        if self.cause is not None:
            parts.append(self.cause.render())
            parts.append("\nThe above exception was the direct cause of the following exception:\n\n")
        parts.append(
            "Traceback (most recent call last):\n"
            '  File "/usr/local/bin/vllm", line 10, in <module>\n'
            "    sys.exit(main())\n"
            f'  File "{_SITE}/{self.where}", in <module>\n'
            f"{self.exc_type}: {self.message}\n"
        )
        return "".join(parts)

    def print(self, stream: TextIO | None = None) -> None:
        """Write the traceback to stderr, where Python writes an uncaught exception."""
        out = stream or sys.stderr
        out.write(self.render())
        out.flush()


class CommandFailed(Exception):
    """The container command fails before vLLM runs at all (a shell or argparse error): message and code."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code
