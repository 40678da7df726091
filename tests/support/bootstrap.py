"""`python -m flows.bootstrap gcp` as the integration tests run it: in-process, against the session sandbox."""

from __future__ import annotations

import uuid

from flows.bootstrap import main


def unique(prefix: str) -> str:
    """A name of the test's own."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def bootstrap(sandbox, capsys, *args: str) -> tuple[int, str, str]:
    """bootstrap gcp for the sandbox's project and region with ``args``: its exit code, stdout and stderr."""
    target = sandbox.info["target"]
    code = main(["gcp", "--project", target["project"], "--region", target["region"], *args])
    out, err = capsys.readouterr()
    return code, out, err
