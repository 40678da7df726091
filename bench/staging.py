"""Staging throughput: our stager vs the seeds' two-step copy vs the emulator's ceiling, in one run.

    python -m bench.staging [--sizes-gib 1,4] [--json out.json]

For each model size it generates a sharded safetensors model on the sandbox Hub, then measures, each in its
own child process and into its own empty bucket:
  ours      tasks.staging.stage_model (Hub -> GCS streaming, verified, manifest last)
  again     the same call once more (everything verified and skipped)
  baseline  the seeds' way: snapshot_download to a temporary folder, then upload each file
  ceiling   the same bytes, already in memory, uploaded with the same client, parallelism and chunk size
and prints MB/s, the ratios ours/baseline and ours/ceiling, peak RSS and bytes written to local disk
(/proc/self/io write_bytes, counted when pages are dirtied, so deleted temp files count too).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

GIB = 1024**3
REPO = "bench/model-{size}g"


def _proc_io() -> dict[str, int]:
    with open("/proc/self/io") as handle:
        return {k: int(v) for k, v in (line.split(": ") for line in handle)}


def _child_report(seconds: float, uploaded: int, disk_before: int, **extra: object) -> None:
    print(
        json.dumps(
            {
                "seconds": seconds,
                "bytes": uploaded,
                "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                "cpu_s": sum(resource.getrusage(resource.RUSAGE_SELF)[:2]),
                "disk_write_bytes": _proc_io()["write_bytes"] - disk_before,
                **extra,
            }
        )
    )


def child(method: str, spec: dict) -> None:
    """One measurement, run in a fresh process so RSS and disk counters are its own."""
    from pydantic import SecretStr

    from blocks import GcpTarget, ModelSource
    from tasks import clients
    from tasks.hub import resolve_model
    from tasks.selection import select_files
    from tasks.staging import StagingOptions, stage_model

    target = GcpTarget.model_validate(spec["target"])
    source = ModelSource.model_validate(spec["source"])
    token = SecretStr(spec["token"])
    options = StagingOptions.model_validate(spec.get("options", {}))
    disk_before = _proc_io()["write_bytes"]
    if method == "ours":
        started = time.perf_counter()
        result = stage_model(target, source, token, options)
        _child_report(time.perf_counter() - started, result.bytes_uploaded, disk_before, noop=result.noop)
        return

    access = clients.hub(source, token)
    resolved = resolve_model(access, source, options.retry)
    files = select_files(resolved.files)
    bucket = clients.storage(target).bucket(target.bucket_name)
    prefix = f"{target.model_prefix}/{source.repo_id}/{resolved.commit}"
    chunk = options.chunk_mib * 1024 * 1024
    total = sum(f.size for f in files)

    if method == "baseline":
        from huggingface_hub import snapshot_download

        started = time.perf_counter()
        with tempfile.TemporaryDirectory(dir=spec["scratch"]) as tmp:
            folder = Path(
                snapshot_download(
                    source.repo_id,
                    revision=resolved.commit,
                    endpoint=access.endpoint,
                    token=spec["token"],
                    local_dir=tmp,
                    allow_patterns=[f.path for f in files],
                )
            )

            def upload(path: str) -> None:
                bucket.blob(f"{prefix}/{path}", chunk_size=chunk).upload_from_filename(str(folder / path))

            with ThreadPoolExecutor(options.parallel_files) as pool:
                list(pool.map(upload, [f.path for f in files]))
        _child_report(time.perf_counter() - started, total, disk_before)
        return

    # ceiling: fetch the bytes first (not timed), then upload them from memory the same way ours does.
    import httpx
    from huggingface_hub import hf_hub_url

    with httpx.Client(timeout=120, follow_redirects=True) as http:
        payloads = {
            f.path: http.get(
                hf_hub_url(source.repo_id, f.path, revision=resolved.commit, endpoint=access.endpoint),
                headers={"Authorization": f"Bearer {spec['token']}"},
            ).content
            for f in files
        }
    disk_before = _proc_io()["write_bytes"]

    def upload_memory(path: str) -> None:
        data = payloads[path]
        bucket.blob(f"{prefix}/{path}", chunk_size=chunk).upload_from_file(
            io.BytesIO(data), size=len(data), checksum=None
        )

    started = time.perf_counter()
    with ThreadPoolExecutor(options.parallel_files) as pool:
        list(pool.map(upload_memory, sorted(payloads, key=lambda p: -len(payloads[p]))))
    _child_report(time.perf_counter() - started, total, disk_before)


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _sandbox_pids(sb) -> dict[str, int]:
    """The sandbox process (Hub, CDN, GCS front, control plane) and the GCS emulator it started."""
    # Children are listed under the thread that started them (the emulator starts from a worker thread).
    children = [
        p for task in Path(f"/proc/{sb.process.pid}/task").iterdir() for p in (task / "children").read_text().split()
    ]
    emulator = next(int(p) for p in children if "fake-gcs-server" in Path(f"/proc/{p}/cmdline").read_text())
    return {"sandbox": sb.process.pid, "emulator": emulator}


def _run_child(method: str, spec: dict) -> dict:
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    out = subprocess.run(
        [sys.executable, "-m", "bench.staging", "--child", method, json.dumps(spec)],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _empty_bucket(storage, name: str, region: str) -> None:
    bucket = storage.bucket(name)
    if bucket.exists():
        for blob in storage.list_blobs(bucket):
            blob.delete()
    else:
        storage.create_bucket(name, location=region)


def measure(sb, size_gib: float, scratch: str, options: dict, methods: tuple[str, ...], repeat: int) -> dict:
    from blocks import GcpTarget
    from tasks import clients

    repo_id = REPO.format(size=f"{size_gib:g}")
    started = time.perf_counter()
    sb.hub(
        "POST",
        "/repos",
        json={
            "repo_id": repo_id,
            "weight_bytes": int(size_gib * GIB),
            "shards": max(2, int(size_gib * 4)),
            "include_bin_duplicate": False,
            "include_original": False,
            "replace": True,
        },
        timeout=600,
    )
    print(f"  generated {repo_id} in {time.perf_counter() - started:.1f} s", flush=True)
    base = GcpTarget.model_validate(sb.target)
    storage = clients.storage(base)
    figures: dict[str, dict] = {}
    for method in [m for _ in range(repeat) for m in methods]:
        bucket = "bench-ours" if method in ("ours", "again") else f"bench-{method}"
        if method != "again":
            _empty_bucket(storage, bucket, base.region)
        target = base.model_copy(update={"bucket": bucket}).model_dump(mode="json", exclude={"gcp_credentials"})
        spec = {
            "target": target,
            "source": {"repo_id": repo_id, "hub_endpoint": sb.hub_url},
            "token": sb.hub_token,
            "scratch": scratch,
            "options": options,
        }
        pids = _sandbox_pids(sb)
        before = {name: _cpu_seconds(pid) for name, pid in pids.items()}
        f = _run_child("ours" if method == "again" else method, spec)
        f.update({f"{name}_cpu_s": _cpu_seconds(pid) - before[name] for name, pid in pids.items()})
        peak = max(f["peak_rss_mib"], figures.get(method, {}).get("peak_rss_mib", 0))
        if method not in figures or f["seconds"] < figures[method]["seconds"]:
            figures[method] = f  # best time of the repeats: noise on a shared 2-core box only ever slows a run
        figures[method]["peak_rss_mib"] = peak  # but the worst memory of them
        print(
            f"  {method:9s} {f['seconds']:7.2f} s  {f['bytes'] / 1e6 / f['seconds'] if f['bytes'] else 0:7.1f} MB/s"
            f"  peak RSS {f['peak_rss_mib']:6.0f} MiB  disk {f['disk_write_bytes'] / 1e6:8.1f} MB"
            f"  CPU s: own {f['cpu_s']:5.1f} sandbox {f['sandbox_cpu_s']:5.1f} emulator {f['emulator_cpu_s']:5.1f}",
            flush=True,
        )
        if method != "ours":
            _empty_bucket(storage, bucket, base.region)  # the emulator keeps objects in RAM
    total = figures["ours"]["bytes"]
    rate = {m: total / 1e6 / figures[m]["seconds"] for m in ("ours", "baseline", "ceiling") if m in figures}
    return {
        "size_gib": size_gib,
        "options": options,
        "bytes": total,
        "mb_per_s": rate,
        "ours_over_baseline": rate["ours"] / rate["baseline"] if "baseline" in rate else None,
        "ours_over_ceiling": rate["ours"] / rate["ceiling"] if "ceiling" in rate else None,
        "second_run_share": figures["again"]["seconds"] / figures["ours"]["seconds"] if "again" in figures else None,
        "figures": figures,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes-gib", default="1,4", help="comma-separated model sizes in GiB")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument("--parallel-files", type=int, default=None, help="StagingOptions.parallel_files")
    parser.add_argument("--chunk-mib", type=int, default=None, help="StagingOptions.chunk_mib")
    parser.add_argument("--only", default="ours,again,baseline,ceiling", help="methods to run")
    parser.add_argument("--repeat", type=int, default=2, help="runs of each method; the best one counts")
    parser.add_argument("--child", nargs=2, metavar=("METHOD", "SPEC"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], json.loads(args.child[1]))
        return 0

    from sandbox.handle import SandboxHandle

    results = []
    with (
        tempfile.TemporaryDirectory(prefix="bench-staging-") as scratch,
        SandboxHandle.start(Path(scratch) / "sandbox", "--config", str(_sandbox_config(Path(scratch)))) as sb,
    ):
        print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
        for size in (float(s) for s in args.sizes_gib.split(",")):
            print(f"\n{size:g} GiB model", flush=True)
            options = {k: v for k, v in (("parallel_files", args.parallel_files), ("chunk_mib", args.chunk_mib)) if v}
            results.append(measure(sb, size, scratch, options, tuple(args.only.split(",")), args.repeat))
    print(
        "\n| model | ours MB/s | baseline MB/s | ceiling MB/s | ours/baseline | ours/ceiling | peak RSS ours "
        "| local disk ours | local disk baseline | 2nd run / 1st |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        f = r["figures"]
        print(
            f"| {r['size_gib']:g} GiB | {r['mb_per_s']['ours']:.0f} | {r['mb_per_s']['baseline']:.0f} | "
            f"{r['mb_per_s']['ceiling']:.0f} | {r['ours_over_baseline']:.2f} | {r['ours_over_ceiling']:.2f} | "
            f"{f['ours']['peak_rss_mib']:.0f} MiB | {f['ours']['disk_write_bytes']} B | "
            f"{f['baseline']['disk_write_bytes'] / 1e6:.0f} MB | {100 * r['second_run_share']:.1f} % |"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


def _sandbox_config(folder: Path) -> Path:
    path = folder / "sandbox-config.json"
    path.write_text(json.dumps({"seed_models": True}))
    return path


if __name__ == "__main__":
    sys.exit(main())
