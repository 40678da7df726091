"""One sandbox with the real vLLM engine and a Prefect server, with the sandbox's blocks saved: what the real-engine
benches (load_modes, compile_cache) promote and measure on."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def engine_sandbox(prefix: str, metadata_port: int) -> Iterator[Path]:
    """A real-engine sandbox in a scratch folder (yielded), Prefect's test server, and the sandbox's blocks."""
    from prefect.testing.utilities import prefect_test_harness

    from sandbox.blocks import save_sandbox_blocks
    from sandbox.handle import SandboxHandle

    with (
        tempfile.TemporaryDirectory(prefix=prefix) as scratch,
        SandboxHandle.start(Path(scratch), "--metadata-port", str(metadata_port), "--engine", "vllm") as sandbox,
        prefect_test_harness(server_startup_timeout=300),
    ):
        os.environ["HF_ENDPOINT"] = sandbox.hub_url
        save_sandbox_blocks(Path(scratch))
        yield Path(scratch)
