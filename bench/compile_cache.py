"""The compile cache on the real engine: eager, compiled, and compiled with the cache kept in the bucket.

sandbox/tiny-llama (deployments/sandbox/tiny-llama.yaml, the cpu preset) is promoted on ONE sandbox with the real
vLLM engine (``make engine`` first) three times, each on its own service and profile:

- ``eager``: the cpu preset as shipped (--enforce-eager);
- ``compiled``: vllm.enforce_eager off, no cache: every start compiles with fresh caches (the instance's own disk);
- ``cached``: vllm.enforce_eager off and the profile's compile_cache: vLLM's and Inductor's caches on a read-write
  Cloud Storage volume (tasks/deploy/compile_cache.py). Promoted first, so its account's grants (read the bucket,
  write compile-cache/) are made in one policy edit and count together: the promotion's start compiles and saves,
  and every later start of that configuration restores (the cold-start copy mounts the same folder).

A first start with the cache costs what ``compiled`` costs (nothing to restore, and the files are uploaded as they are
closed): ``compiled`` is the first start, ``cached`` the second and later ones.

Then the product's own ``cold-start`` flow measures ``--samples`` cold starts of each (a copy of the serving revision
started from zero each time): time to first token, the phases read from Cloud Run's and vLLM's lines, and the decode
speed of the same request (64 tokens, ignore_eos). Printed: a row per sample, then medians, and the ratios that
answer the issue: the cached start against the first (compiling) one and against eager, and compiled decode speed
against eager.

In the sandbox the volume is a local folder (sandbox/vllm/real_engine.py) written back to the bucket by the launcher
(gcsfuse uploads a file when it is closed); on Cloud Run the restore reads through gcsfuse, slower for many small files.

    python -m bench.compile_cache [--engine-venv .engine] [--samples 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

from bench.engine_sandbox import engine_sandbox

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "deployments" / "sandbox" / "tiny-llama.yaml"
KINDS = ("cached", "compiled", "eager")
SHOWN = ("engine_setup", "weights_load", "compile", "kv_cache_init", "api_server_start", "startup_probe")


def profiles() -> dict[str, object]:
    from blocks.profile import ServingProfile

    compiled = {"vllm": {"max_model_len": 2048, "max_num_seqs": 8, "dtype": "bfloat16", "enforce_eager": False}}
    return {
        "cached": ServingProfile.preset("cpu", compile_cache=True, **compiled),
        "compiled": ServingProfile.preset("cpu", **compiled),
        "eager": ServingProfile.preset("cpu"),
    }


def measure(samples: int, metadata_port: int) -> list[dict]:
    """Each kind promoted once and measured with the cold-start flow; a row per sample."""
    from flows.cold_start import cold_start
    from flows.promote import promote_model
    from tasks.deploy.probe import VerifyOptions

    rows = []
    with engine_sandbox("bench-compile-cache-", metadata_port):
        for kind, profile in profiles().items():
            profile.save(f"bench-cc-{kind}", overwrite=True)
            service = f"bench-cc-{kind}"
            promoted = promote_model(spec_file=str(SPEC), service=service, profile=f"bench-cc-{kind}",
                                     verify=VerifyOptions(health_period_s=0.5))  # fmt: skip
            print(f"{service}: promoted ({promoted.outcome})", flush=True)
            report = cold_start(service=service, target="sandbox", samples=samples)
            if report.compile_cache:
                print(f"{service}: {saved_objects(report.compile_cache)} objects in {report.compile_cache}", flush=True)
            for sample in report.samples:
                rows.append({"kind": kind, "sample": sample.number, "cold": sample.cold, "ttft_s": sample.ttft_s,
                             "decode_tokens_per_s": sample.decode_tokens_per_s, "phases": sample.phases,
                             "compile_cache": report.compile_cache})  # fmt: skip
                print(_row(rows[-1]), flush=True)
    return rows


def saved_objects(folder: str) -> int:
    """How many objects the compile cache's folder (gs://BUCKET/FOLDER) holds."""
    from flows.common import load_target
    from tasks.common import clients

    bucket, _, prefix = folder.removeprefix("gs://").partition("/")
    return sum(1 for _ in clients.storage(load_target("sandbox")).list_blobs(bucket, prefix=f"{prefix}/"))


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _row(row: dict) -> str:
    phases = [_cell(row["phases"].get(name)) for name in SHOWN]
    cells = [row["kind"], row["sample"], "yes" if row["cold"] else "no", _cell(row["ttft_s"]), *phases,
             _cell(row["decode_tokens_per_s"])]  # fmt: skip
    return "| " + " | ".join(str(c) for c in cells) + " |"


HEADER = ("| kind | sample | cold | ttft s | " + " | ".join(SHOWN) + " | decode tok/s |\n"
          + "|---" * (len(SHOWN) + 5) + "|")  # fmt: skip


def summary(rows: list[dict]) -> dict:
    """Medians per kind, and the ratios the issue asks for."""

    def median(kind: str, key: str) -> float | None:
        found = [r[key] if key in r else r["phases"].get(key) for r in rows if r["kind"] == kind and r["cold"]]
        values = [v for v in found if v is not None]
        return round(statistics.median(values), 2) if values else None

    figures = {
        "eager ttft": median("eager", "ttft_s"),
        "first start ttft (compiled)": median("compiled", "ttft_s"),
        "later start ttft (cached)": median("cached", "ttft_s"),
        "compile phase, first start": median("compiled", "compile"),
        "compile phase, later start": median("cached", "compile"),
        "eager decode tok/s": median("eager", "decode_tokens_per_s"),
        "compiled decode tok/s": median("compiled", "decode_tokens_per_s"),
        "cached decode tok/s": median("cached", "decode_tokens_per_s"),
    }

    def ratio(a: str, b: str) -> float | None:
        return round(figures[a] / figures[b], 2) if figures[a] and figures[b] else None

    figures["later / first ttft"] = ratio("later start ttft (cached)", "first start ttft (compiled)")
    figures["later / eager ttft"] = ratio("later start ttft (cached)", "eager ttft")
    figures["later / first compile"] = ratio("compile phase, later start", "compile phase, first start")
    figures["compiled / eager decode"] = ratio("compiled decode tok/s", "eager decode tok/s")
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine-venv", default=str(ROOT / ".engine"))
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    os.environ["SANDBOX_ENGINE_VENV"] = str(Path(args.engine_venv).resolve())
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    from sandbox.metadata import point_google_auth_at

    metadata_port = point_google_auth_at()
    print(f"machine: {os.cpu_count()} cores; {args.samples} cold starts of each of {', '.join(KINDS)}\n")
    print(HEADER)
    rows = measure(args.samples, metadata_port)
    figures = summary(rows)
    print("\n| figure | value |\n|---|---|")
    for name, value in figures.items():
        print(f"| {name} | {_cell(value)} |")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "summary": figures}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
