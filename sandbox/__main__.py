"""``python -m sandbox up --state-dir DIR`` runs every stand-in until interrupted; ``demo`` shows them off."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from pathlib import Path

from sandbox.config import SandboxConfig


def _usage(info: dict) -> str:
    metadata = info["metadata_url"].removeprefix("http://")
    return f"""Sandbox is up. Everything listens on loopback; nothing here reaches Google or Hugging Face.

  control plane (Cloud Run, Cloud Build, Compute, IAM, ...): {info["control_url"]}
  Hugging Face Hub stand-in:                                 {info["hub_url"]}  (CDN {info["cdn_url"]})
  GCS emulator (fake-gcs-server):                            {info["gcs_url"]}
  Hub repos: {", ".join(info["hub"]["repos"])}

Point the product at it with the target in {info["state_dir"]}/sandbox.json, e.g.
  export HF_ENDPOINT={info["hub_url"]} HF_TOKEN={info["hub"]["token"]} HF_HUB_DISABLE_XET=1
  export GCE_METADATA_HOST={metadata} GCE_METADATA_IP={metadata}  # ID tokens for the private services
  python -c "import json; print(json.load(open('{info["state_dir"]}/sandbox.json'))['target'])"
Inject faults with POST {info["control_url"]}/_sandbox/faults  (see sandbox/faults.py).
{_tls_usage(info)}Ctrl-C stops it.
"""


# --- TLS face (sandbox/tls.py, sandbox/netns.py) ------------------------------------------------------------------
def _tls_usage(info: dict) -> str:
    """The usage lines for the TLS face, or nothing when it is off."""
    tls = info.get("tls")
    if not tls:
        return ""
    ca = tls["ca_file"]
    return f"""TLS face (https://run.googleapis.com and {len(tls["names"]) - 1} more Google API hosts): {tls["url"]}
  Its names resolve to it only inside the same private namespace: start this sandbox and its clients under
  python -m sandbox.netns -- CMD. Clients trust its throwaway CA when told:
  export HTTPLIB2_CA_CERTS={ca} SSL_CERT_FILE={ca} REQUESTS_CA_BUNDLE={ca}
"""


# --- end TLS face ------------------------------------------------------------------------------------------------


async def _serve(state_dir: Path, config: SandboxConfig, quiet: bool, tls_port: int | None = None) -> None:
    from sandbox.runtime import SandboxRuntime

    runtime = SandboxRuntime(state_dir, config, tls_port=tls_port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        info = await runtime.start()
        if not quiet:
            print(_usage(info), flush=True)
        await stop.wait()
    finally:
        await runtime.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sandbox", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start every stand-in and run until interrupted")
    up.add_argument("--state-dir", type=Path, default=Path(".sandbox"), help="where sandbox.json and logs go")
    up.add_argument("--time-scale", type=float, default=None, help="real seconds per simulated second")
    up.add_argument("--config", type=Path, default=None, help="JSON file with SandboxConfig fields")
    up.add_argument("--quiet", action="store_true", help="print nothing; read sandbox.json instead")
    up.add_argument(
        "--metadata-port", type=int, default=None, help="port of the metadata server stand-in (GCE_METADATA_HOST)"
    )
    engine_help = "what serves CPU revisions: the stand-in, or the real vLLM engine (`make engine` first)"
    up.add_argument("--engine", choices=("stand-in", "vllm"), default=None, help=engine_help)
    # --- TLS face (sandbox/tls.py): for clients that hard-code Google's host names; pair with sandbox.netns ---
    up.add_argument(
        "--tls-names",
        action="store_true",
        help="also serve the APIs over HTTPS as run.googleapis.com etc. (throwaway CA in STATE_DIR/tls); the names "
        "resolve to it only inside `python -m sandbox.netns -- CMD`",
    )
    up.add_argument("--tls-port", type=int, default=None, help="port of the TLS face (default 443; 0: any free)")
    demo = sub.add_parser("demo", help="start a sandbox and walk through a model going live on it")
    demo.add_argument("--state-dir", type=Path, default=Path(".sandbox/demo"))
    demo.add_argument("--engine", choices=("stand-in", "vllm"), default="stand-in", help=engine_help)
    blocks = sub.add_parser("blocks", help="save the Prefect blocks that point the flows at a running sandbox")
    blocks.add_argument("state_dir", type=Path, help="the running sandbox's --state-dir")
    args = parser.parse_args(argv)

    if args.command == "up":
        settings = json.loads(args.config.read_text()) if args.config else {}
        if args.time_scale is not None:
            settings["time_scale"] = args.time_scale
        if args.metadata_port is not None:
            settings["metadata_port"] = args.metadata_port
        if args.engine is not None:
            settings["engine"] = args.engine
        if args.tls_port is not None and not args.tls_names:
            parser.error("--tls-port needs --tls-names")
        tls_port = None  # TLS face (sandbox/tls.py): off unless --tls-names
        if args.tls_names:
            from sandbox.tls import DEFAULT_TLS_PORT

            tls_port = DEFAULT_TLS_PORT if args.tls_port is None else args.tls_port
        asyncio.run(_serve(args.state_dir.resolve(), SandboxConfig.model_validate(settings), args.quiet, tls_port))
        return 0
    if args.command == "blocks":
        from sandbox.blocks import save_sandbox_blocks

        target = save_sandbox_blocks(args.state_dir.resolve())
        print(f"saved GcpTarget 'sandbox' ({target.project}/{target.region}) and Secret 'sandbox-hf-token'")
        return 0
    from sandbox.demo import run_demo

    return run_demo(args.state_dir.resolve(), engine=args.engine)


if __name__ == "__main__":
    sys.exit(main())
