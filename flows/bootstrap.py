"""Create the blocks the deployments use for a real project: `python -m flows.bootstrap gcp --project P --region R`.

It saves a GcpTarget with Google's endpoints and Application Default Credentials, and, if HF_TOKEN is set, a
Secret block holding it. (A running sandbox's blocks: `python -m sandbox blocks DIR`.)
"""

from __future__ import annotations

import argparse
import os
import sys

from prefect.blocks.system import Secret

from blocks import GcpTarget, ModelSource, ServingProfile


def register_block_types() -> None:
    for block in (GcpTarget, ServingProfile, ModelSource):
        block.register_type_and_schema()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.bootstrap", description=__doc__)
    sub = parser.add_subparsers(dest="kind", required=True)
    gcp = sub.add_parser("gcp", help="blocks for a real project")
    gcp.add_argument("--project", required=True)
    gcp.add_argument("--region", required=True)
    gcp.add_argument("--name", default="production", help="GcpTarget block name")
    gcp.add_argument("--invoker", action="append", default=[], help="principal allowed to call services")
    args = parser.parse_args(argv)
    register_block_types()
    target = GcpTarget(project=args.project, region=args.region, invokers=args.invoker)
    target.save(args.name, overwrite=True)
    print(f"saved GcpTarget '{args.name}' ({target.project}/{target.region}, bucket gs://{target.bucket_name})")
    if os.environ.get("HF_TOKEN"):
        Secret(value=os.environ["HF_TOKEN"]).save("hf-token", overwrite=True)
        print("saved Secret 'hf-token' from HF_TOKEN; name it in token_secret_block")
    return 0


if __name__ == "__main__":
    sys.exit(main())
