"""The Prefect blocks that point the flows at a running sandbox: ``python -m sandbox blocks DIR``.

DIR/sandbox.json (written by ``python -m sandbox up``) holds the sandbox's GcpTarget (its endpoints and anonymous
credentials) and its Hub token; they are saved as the GcpTarget "sandbox" and the Secret "sandbox-hf-token".
The flows then take the sandbox like any target: by block name.

``python -m sandbox clock NAME`` instead fits a GcpTarget made by ``python -m flows.bootstrap gcp --endpoints`` (the
README's try-out) to the sandbox's clock, which runs field durations 100 times as fast as Google's.
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


# The GcpTarget fields that say how fast the cloud is: the sandbox's Cloud Run operations finish and its Cloud
# Monitoring samples at its time scale (60 simulated seconds = 0.6 s at 0.01), so a target with Google's timing would
# watch a promotion for 10 real minutes of 60 s samples that arrive every 0.6 s here.
CLOCK_FIELDS = ("operation_poll_seconds", "metrics_sample_seconds", "metrics_delay_seconds")


def set_sandbox_clock(state_dir: Path, target_name: str) -> str:
    """Give the saved GcpTarget ``target_name``, which must point at the sandbox of ``state_dir``, the sandbox's
    timing (sandbox.json's); every other field stays as saved. Returns what it set."""
    info = json.loads((state_dir / "sandbox.json").read_text())
    try:
        target = GcpTarget.load(target_name)
    except ValueError:
        raise ValueError(f"no GcpTarget '{target_name}': run python -m flows.bootstrap gcp first") from None
    run = target.endpoints.run if target.endpoints else None
    if run != info["target"]["endpoints"]["run"]:
        # Google's own project must keep Google's timing: a 0.6 s watch there would judge samples not yet taken.
        raise ValueError(
            f"GcpTarget '{target_name}' does not point at the sandbox in {state_dir} (its Cloud Run endpoint is "
            f"{run or 'Google'}); give bootstrap gcp --endpoints {state_dir}/endpoints.json"
        )
    for field in CLOCK_FIELDS:
        setattr(target, field, info["target"][field])
    target.save(target_name, overwrite=True)
    return f"GcpTarget '{target_name}' on the sandbox's clock: " + ", ".join(
        f"{field} {getattr(target, field):g}" for field in CLOCK_FIELDS
    )
