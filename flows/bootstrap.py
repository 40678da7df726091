"""Create the blocks the deployments use: `python -m flows.bootstrap sandbox DIR` or `... gcp --project P --region R`.

For the sandbox it reads DIR/sandbox.json (written by `python -m sandbox up`) and saves the GcpTarget
"sandbox" and the Secret "sandbox-hf-token". For a real project it saves a GcpTarget with Google's endpoints
and Application Default Credentials, and, if HF_TOKEN is set, a Secret block holding it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from prefect.blocks.system import Secret

from blocks import GcpTarget, ModelSource, ServingProfile


def register_block_types() -> None:
    for block in (GcpTarget, ServingProfile, ModelSource):
        block.register_type_and_schema()


def bootstrap_sandbox(
    state_dir: Path, target_name: str = "sandbox", secret_name: str = "sandbox-hf-token"
) -> GcpTarget:
    info = json.loads((state_dir / "sandbox.json").read_text())
    target = GcpTarget.model_validate(info["target"])
    target.save(target_name, overwrite=True)
    Secret(value=info["hub"]["token"]).save(secret_name, overwrite=True)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.bootstrap", description=__doc__)
    sub = parser.add_subparsers(dest="kind", required=True)
    sandbox = sub.add_parser("sandbox", help="blocks for a running sandbox")
    sandbox.add_argument("state_dir", type=Path)
    gcp = sub.add_parser("gcp", help="blocks for a real project")
    gcp.add_argument("--project", required=True)
    gcp.add_argument("--region", required=True)
    gcp.add_argument("--name", default="production", help="GcpTarget block name")
    gcp.add_argument("--invoker", action="append", default=[], help="principal allowed to call services")
    args = parser.parse_args(argv)
    register_block_types()
    if args.kind == "sandbox":
        target = bootstrap_sandbox(args.state_dir.resolve())
        print(f"saved GcpTarget 'sandbox' ({target.project}/{target.region}) and Secret 'sandbox-hf-token'")
        return 0
    target = GcpTarget(project=args.project, region=args.region, invokers=args.invoker)
    target.save(args.name, overwrite=True)
    print(f"saved GcpTarget '{args.name}' ({target.project}/{target.region}, bucket gs://{target.bucket_name})")
    if os.environ.get("HF_TOKEN"):
        Secret(value=os.environ["HF_TOKEN"]).save("hf-token", overwrite=True)
        print("saved Secret 'hf-token' from HF_TOKEN; name it in token_secret_block")
    return 0


if __name__ == "__main__":
    sys.exit(main())
