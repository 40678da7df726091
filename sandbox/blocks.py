"""The Prefect blocks that point the flows at a running sandbox: ``python -m sandbox blocks DIR``.

DIR/sandbox.json (written by ``python -m sandbox up``) holds the sandbox's GcpTarget (its endpoints and anonymous
credentials) and its Hub token; they are saved as the GcpTarget "sandbox" and the Secret "sandbox-hf-token".
The flows then take the sandbox like any target: by block name.
"""

from __future__ import annotations

import json
from pathlib import Path

from prefect.blocks.system import Secret

from blocks import GcpTarget
from flows.bootstrap import register_block_types


def save_sandbox_blocks(
    state_dir: Path, target_name: str = "sandbox", secret_name: str = "sandbox-hf-token"
) -> GcpTarget:
    register_block_types()
    info = json.loads((state_dir / "sandbox.json").read_text())
    target = GcpTarget.model_validate(info["target"])
    target.save(target_name, overwrite=True)
    Secret(value=info["hub"]["token"]).save(secret_name, overwrite=True)
    return target
