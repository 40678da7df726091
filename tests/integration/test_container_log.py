"""The launcher's reading of a container's output (sandbox/control/run/container_log.py) and Cloud Logging's reading of
what it wrote (sandbox/control/logging/entries.py), with a real child process writing to real pipes: each line stamped
on arrival with the stream it came on, a tqdm bar's carriage returns kept inside one line, a line cut off by a kill
logged as it is, an overlong line split, and Cloud Run's own lines around them."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from sandbox.control.logging.entries import LogLine, LogStore, RevisionLog, entry_json
from sandbox.control.run.container_log import MAX_LINE_BYTES, ContainerLog

PROJECT = "sandbox-project"
START = "Starting new instance. Reason: AUTOSCALING - ..."
KILLED = "Container terminated on signal 9."
# Writes to both streams, flushing each piece, then kills itself in the middle of a line.
CONTAINER = f"""
import os, sys
def out(text): sys.stdout.write(text); sys.stdout.flush()
def err(text): sys.stderr.write(text); sys.stderr.flush()
out("first on stdout\\n")
err("Loading: 0%\\rLoading: 50%|#####     |\\r")
err("Loading: 100%|##########|\\n")
out("second on stdout\\n\\n")
out("x" * {MAX_LINE_BYTES + 10} + "\\n")
out("cut off mid-li")
os.kill(os.getpid(), 9)
"""


async def run_container(workdir: Path) -> int:
    log = ContainerLog(workdir, "f00d", "vllm")
    log.system(START, "INFO")
    stdout, stderr = log.open_pipes()
    process = await asyncio.create_subprocess_exec(sys.executable, "-c", CONTAINER, stdout=stdout, stderr=stderr)
    log.attach()
    code = await process.wait()
    log.system(KILLED, "WARNING")
    log.close()
    return code


def read(run_dir: Path) -> list[tuple[RevisionLog, LogLine]]:
    """Every entry of the run state, in Cloud Logging's order."""
    logs = LogStore(run_dir, "us-central1").refresh({}, {})
    return sorted(((log, line) for log in logs for line in log.lines), key=lambda pair: (pair[1].ts_ns, pair[1].seq))


def test_each_line_has_its_arrival_time_and_stream_between_cloud_runs_lines(tmp_path: Path) -> None:
    workdir = tmp_path / "run" / "svc" / "svc-00001-abc"
    workdir.mkdir(parents=True)
    assert asyncio.run(run_container(workdir)) == -9

    found = read(tmp_path / "run")
    texts = [line.text for _, line in found]
    assert texts[0] == START and texts[-1] == KILLED
    by_stream = {
        stream: [line.text for _, line in found if line.stream == stream] for stream in ("stdout", "stderr")
    }  # fmt: skip
    long_line = "x" * (MAX_LINE_BYTES + 10)
    assert (
        by_stream["stdout"]
        == [
            "first on stdout",
            "second on stdout",  # the empty line after it is no entry
            long_line[:MAX_LINE_BYTES],
            long_line[MAX_LINE_BYTES:],
            "cut off mid-li",  # what the kill left: a line of its own
        ]
    )
    assert by_stream["stderr"] == ["Loading: 0%\rLoading: 50%|#####     |\rLoading: 100%|##########|"]
    stamps = [line.ts_ns for _, line in found]
    assert stamps == sorted(stamps) and len(set(stamps)) == len(stamps)
    assert {line.instance_id for _, line in found} == {"f00d"}

    entries = [entry_json(log, line, PROJECT) for log, line in found]
    assert (entries[0]["logName"], entries[0]["severity"]) == (
        f"projects/{PROJECT}/logs/run.googleapis.com%2Fvarlog%2Fsystem",
        "INFO",
    )
    assert entries[0]["labels"] == {"instanceId": "f00d", "container_name": "vllm"}
    assert entries[-1]["severity"] == "WARNING"
    stderr = next(e for e in entries if e["textPayload"].startswith("Loading"))
    assert (stderr["logName"].endswith("run.googleapis.com%2Fstderr"), stderr["severity"]) == (True, "ERROR")
    first = next(e for e in entries if e["textPayload"] == "first on stdout")
    assert (first["logName"].endswith("run.googleapis.com%2Fstdout"), first["severity"]) == (True, "DEFAULT")
    assert first["labels"] == {"instanceId": "f00d"}

    # The container's output file holds exactly what it wrote, line by line (the admin API and log tails read it).
    written = (workdir / "container.log").read_bytes().decode()
    assert sorted(written.split("\n")) == sorted(["", *by_stream["stdout"], *by_stream["stderr"], ""])


def test_a_line_written_beside_the_launcher_follows_the_line_before_it(tmp_path: Path) -> None:
    workdir = tmp_path / "run" / "svc" / "svc-00001-abc"
    workdir.mkdir(parents=True)
    asyncio.run(run_container(workdir))
    before = read(tmp_path / "run")
    last_container_line = max(line.ts_ns for _, line in before if line.stream in ("stdout", "stderr"))
    with (workdir / "container.log").open("a") as out:  # no record: a note the sandbox wrote with no instance
        out.write("serve: command not found\n")
    store = LogStore(tmp_path / "run", "us-central1")
    logs = store.refresh({}, {})
    added = next(line for log in logs for line in log.lines if line.text == "serve: command not found")
    assert added.ts_ns == last_container_line + 1_000
    assert added.stream == "stderr"  # told apart by its shape, as before records
