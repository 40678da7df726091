"""Changing one sandbox setting for a single test: the session shares one sandbox, so the value must come back."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from sandbox.handle import SandboxHandle


@contextlib.contextmanager
def config_setter(sandbox: SandboxHandle, key: str) -> Iterator[Callable[[object], dict]]:
    """A setter for the sandbox config ``key`` (``POST /_sandbox/config``); the value it had before is restored on
    exit, also when the test fails."""
    before = sandbox.configure()[key]
    try:
        yield lambda value: sandbox.configure(**{key: value})
    finally:
        sandbox.configure(**{key: before})


@contextlib.contextmanager
def sandbox_settings(sandbox: SandboxHandle, **changes: object) -> Iterator[None]:
    """Sandbox settings for the block; the previous values come back after, whatever happens."""
    before = sandbox.configure()
    sandbox.configure(**changes)
    try:
        yield
    finally:
        sandbox.configure(**{key: before[key] for key in changes})
