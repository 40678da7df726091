"""The README's main job, as a user starts it: `python -m sandbox demo` (what `make demo` runs)."""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def test_the_demo_promotes_answers_repromotes_as_a_no_op_and_refuses_the_generic_image(tmp_path):
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect-home")}
    for inherited in ("PREFECT_API_URL", "HF_ENDPOINT"):  # its own sandbox and its own Prefect, like a user's
        env.pop(inherited, None)
    command = [sys.executable, "-m", "sandbox", "demo", "--state-dir", str(tmp_path / "sandbox")]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    out = done.stdout
    assert done.returncode == 0, out[-3000:] + done.stderr[-3000:]
    assert re.search(r"promoted: revision tiny-chat-\w{7}-\w{6} serves \[\('tiny-chat-\w{7}-\w{6}', 100\)\]", out)
    assert "without a token: HTTP 403" in out
    assert re.search(r"answer: '.+' \(\d+ tokens\)", out)
    assert "unchanged in" in out and "(no-op: True)" in out
    refusal = out.split("refused before any cloud call:", 1)[1]
    assert "error: image: vllm/vllm-openai" in refusal and "error: service: 'tiny_chat_v2'" in refusal  # both findings
    assert (tmp_path / "prefect-home").is_dir()  # the run history `make ui` shows
    # Each promote-model run keeps its INFO logs in the API's database: the UI's log tab is not empty although
    # the demo's console is quiet (read from the database `make ui` serves, which is what the UI lists).
    with sqlite3.connect(tmp_path / "prefect-home" / "prefect.db") as db:
        rows = db.execute(
            "SELECT flow_run.id, COUNT(log.id) FROM flow_run JOIN flow ON flow.id = flow_run.flow_id "
            "LEFT JOIN log ON log.flow_run_id = flow_run.id AND log.level = 20 "
            "WHERE flow.name = 'promote-model' GROUP BY flow_run.id"
        ).fetchall()
        messages = [m for (m,) in db.execute("SELECT message FROM log WHERE level = 20")]
    assert len(rows) == 3, rows  # promoted, unchanged, refused
    assert all(count > 0 for _, count in rows), f"runs without INFO logs in the API: {rows}"
    assert any("staging sandbox/tiny-chat@" in m for m in messages), messages[:20]
