"""The real engine against the stand-in's model of it: time to ready and memory, for one promotion of each.

sandbox/tiny-llama is promoted with deployments/sandbox/tiny-llama.yaml (the cpu preset) on a sandbox with the
stand-in, then on one with the real vLLM engine (``make engine`` first). Printed for each:

- ``deploy candidate``: the promotion step's real seconds, from the deploy call until the revision is ready (the
  startup probe passed): for the engine its whole start, for the stand-in its start at 1/100 of real time;
- ``modelled``: the start the stand-in simulates for the same model and flags (its log's "ready after N simulated
  seconds"): what it claims the engine would take;
- ``peak RSS``: the highest resident memory (VmHWM) of each engine process seen while the revision ran, and their
  sum (the API server and its EngineCore child for the engine).

    python -m bench.engine [--engine-venv .engine]
"""

from __future__ import annotations

import argparse
import os
import re
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "deployments" / "sandbox" / "tiny-llama.yaml"
ENGINE_PROCESS = re.compile(r"^VLLM::|/bin/vllm serve |python\S* -m sandbox\.vllm ")


def _engine_processes() -> dict[str, int]:
    """VmHWM (KiB) of every process that is a served revision's engine (real or stand-in), by pid."""
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if ENGINE_PROCESS.search(command):
                found[proc.name] = int(re.search(r"VmHWM:\s+(\d+)", (proc / "status").read_text())[1])
        except (OSError, TypeError):
            continue
    return found


def measure(engine: str, metadata_port: int) -> dict:
    from sandbox.handle import SandboxHandle

    state = Path(tempfile.mkdtemp(prefix=f"bench-engine-{engine}-"))
    peak: dict[str, int] = {}
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            for pid, hwm in _engine_processes().items():
                peak[pid] = max(peak.get(pid, 0), hwm)
            stop.wait(0.5)

    with SandboxHandle.start(state, "--metadata-port", str(metadata_port), "--engine", engine) as sandbox:
        os.environ["HF_ENDPOINT"] = sandbox.hub_url
        from flows.promote import promote_model
        from sandbox.blocks import save_sandbox_blocks
        from tasks.deploy.probe import VerifyOptions

        save_sandbox_blocks(state)
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        report = promote_model(spec_file=str(SPEC), verify=VerifyOptions(health_period_s=0.5))
        stop.set()
        sampler.join()
        log = sandbox.admin.get(f"/run/logs/{report.serving_revision}").text
    modelled = re.findall(r"ready after ([\d.]+) simulated seconds", log)
    steps = {step.name: step.seconds for step in report.steps}
    return {
        "outcome": report.outcome,
        "deploy_s": steps.get("deploy candidate"),
        "modelled_s": float(modelled[-1]) if modelled else None,
        "peak_rss_mb": sorted((kib // 1024 for kib in peak.values()), reverse=True),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine-venv", default=str(ROOT / ".engine"))
    args = parser.parse_args()
    os.environ["SANDBOX_ENGINE_VENV"] = str(Path(args.engine_venv).resolve())
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "300")
    from sandbox.metadata import point_google_auth_at

    metadata_port = point_google_auth_at()
    for engine in ("stand-in", "vllm"):
        result = measure(engine, metadata_port)
        modelled = f", modelled start {result['modelled_s']:.0f} simulated s" if result["modelled_s"] else ""
        rss = result["peak_rss_mb"]
        print(f"{engine:>8}: {result['outcome']}, deploy candidate {result['deploy_s']:.1f} s{modelled}, "
              f"peak RSS {sum(rss):,} MB {rss}", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
