"""What a user looks at after `make demo`, checked in a real browser (Debian's chromium driven by Playwright).

The demo makes its run history as a user would (`python -m sandbox demo` into a fresh PREFECT_HOME); then
`prefect server start` serves it, and chromium opens the pages a user opens from http://127.0.0.1:4200: the promoted
run, its promotion report, the preflight refusal's report, and the run's logs. Run ids and artifact ids come from
Prefect's REST API, as the UI gets them. Each check waits for text to render (Playwright's auto-waiting), never for
a fixed time, and leaves a full-page screenshot under .ui-check/.

Prefect 3.9 serves two UIs: V2 is the default (`/` redirects to `/v2/...`), V1 is one click away ("Switch to V1
UI"). Both are checked; the routes are the bundles' own (`/runs/flow-run/:flowRunId` and
`/artifacts/artifact/:artifactId` in prefect/server/ui/assets/index-*.js; `/runs/flow-run/$id` and
`/artifacts/artifact/$id` in prefect/server/ui-v2/assets/*.js).
"""

from __future__ import annotations

import base64
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Locator, Page, expect, sync_playwright

from sandbox.serving import free_port
from tests.support.screenshots import SCREENSHOTS

ROOT = Path(__file__).resolve().parents[2]
PREFECT = str(Path(sys.executable).parent / "prefect")
# Debian's package: Playwright's own browser download is not reachable from here.
CHROMIUM = os.environ.get("UI_CHECK_CHROMIUM", "/usr/bin/chromium")
SHOTS = Path(os.environ.get("UI_CHECK_DIR", ROOT / ".ui-check"))
# The UI's path prefix, and the screenshot name prefix.
UIS = {"v2": ("/v2", ""), "v1": ("", "v1-")}
SHOT_NAMES = ("promoted-report.png", "refusal-report.png", "flow-run.png", "run-logs.png")
# Rendering on 2 busy cores: the first page compiles the UI's JavaScript while the server answers other requests.
TIMEOUT_MS = 60_000

# PreflightError lists each error finding as "- error: SETTING: MESSAGE" (tasks/checks/preflight.py, Finding.__str__).
FINDING = re.compile(r"^- (error|warning): ([\w.\[\]-]+): (.+)$", re.MULTILINE)


@dataclass(frozen=True)
class Run:
    id: str
    name: str
    state: str
    state_message: str
    report_id: str
    report_key: str
    report: str

    @property
    def headline(self) -> str:
        """The report's first markdown heading, as the UI should show it in its h1."""
        found = re.search(r"^# (.+)$", self.report, re.MULTILINE)
        assert found, f"the report of {self.name} has no '# ' headline:\n{self.report[:500]}"
        return found[1].replace("`", "").strip()


@dataclass(frozen=True)
class History:
    url: str
    promoted: Run
    refused: Run
    logs: list[dict]  # the promoted run's INFO logs, oldest first


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> Iterator[History]:
    """The demo's run history served by a real `prefect server start`, with the runs and reports a user opens."""
    work = tmp_path_factory.mktemp("ui-check")
    # UI_CHECK_PREFECT_HOME: look at a history the demo already made (e.g. `make demo`'s .prefect) instead.
    home = Path(os.environ.get("UI_CHECK_PREFECT_HOME") or work / "prefect-home")
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    for inherited in ("PREFECT_API_URL", "PREFECT_UI_API_URL", "HF_ENDPOINT"):  # the demo brings its own
        env.pop(inherited, None)
    if not os.environ.get("UI_CHECK_PREFECT_HOME"):
        demo = subprocess.run([sys.executable, "-m", "sandbox", "demo", "--state-dir", str(work / "sandbox")],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
        assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # The UI asks PREFECT_UI_API_URL for its data; unset, it would ask port 4200 ("Oops. Something went wrong").
    env.update(PREFECT_API_URL=f"{url}/api", PREFECT_UI_API_URL=f"{url}/api")
    log_path = work / "server.log"
    with log_path.open("wb") as log:
        server = subprocess.Popen([PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                                  cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, f"prefect server exited:\n{log_path.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"prefect server did not answer:\n{log_path.read_text()[-3000:]}"
            try:
                if httpx.get(f"{url}/api/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)  # polling a starting server, not timing anything
        with httpx.Client(base_url=f"{url}/api", timeout=30) as api:
            yield _read_history(api, url)
    finally:
        server.terminate()
        server.wait(timeout=30)


def _read_history(api: httpx.Client, url: str) -> History:
    found = api.post("/flow_runs/filter", json={"flows": {"name": {"any_": ["promote-model"]}}}).raise_for_status()
    runs = sorted(found.json(), key=lambda r: r["created"])
    summary = [(r["name"], r["state_name"]) for r in runs]
    # The demo promotes, re-runs as a no-op, then is refused by preflight (sandbox/demo.py): the first Completed run
    # is the promotion, the Failed run whose exception lists findings is the refusal.
    completed = [r for r in runs if r["state_name"] == "Completed"]
    refusals = [r for r in runs if r["state_name"] == "Failed" and FINDING.search(r["state"]["message"] or "")]
    assert completed and refusals, f"no promoted run or no preflight refusal among the promote-model runs: {summary}"
    promoted, refused = _with_report(api, completed[0]), _with_report(api, refusals[-1])
    logs = api.post("/logs/filter", json={"logs": {"flow_run_id": {"any_": [promoted.id]}, "level": {"ge_": 20}},
                                          "sort": "TIMESTAMP_ASC", "limit": 200})  # fmt: skip
    return History(url=url, promoted=promoted, refused=refused, logs=logs.raise_for_status().json())


def _with_report(api: httpx.Client, run: dict) -> Run:
    artifacts = api.post("/artifacts/filter", json={"artifacts": {"flow_run_id": {"any_": [run["id"]]}}})
    reports = [a for a in artifacts.raise_for_status().json() if (a["key"] or "").startswith("promotion-")]
    assert len(reports) == 1, f"{run['name']}: expected one promotion report, got {[a['key'] for a in reports]}"
    return Run(id=run["id"], name=run["name"], state=run["state_name"], state_message=run["state"]["message"] or "",
               report_id=reports[0]["id"], report_key=reports[0]["key"], report=reports[0]["data"])  # fmt: skip


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: `apt-get install -y chromium` (Debian), or set UI_CHECK_CHROMIUM")
    for name in SHOT_NAMES:  # no screenshot left over from an earlier run passes for this one's
        for _, prefix in UIS.values():
            (SHOTS / f"{prefix}{name}").unlink(missing_ok=True)
    with sync_playwright() as playwright:
        # Playwright runs chromium without its sandbox by default (chromium_sandbox=False), which root needs.
        browser = playwright.chromium.launch(executable_path=CHROMIUM)
        yield browser
        browser.close()


@pytest.fixture(params=list(UIS))
def ui(request: pytest.FixtureRequest, browser: Browser, history: History) -> Iterator[tuple[Page, str, str]]:
    """A fresh page, the UI's base URL and the screenshot name prefix; `v2` is what a user gets by default."""
    prefix, shot_prefix = UIS[request.param]
    # Tall enough for a whole report and the run's logs: V1 scrolls inside its own frame, which a full-page
    # screenshot does not unroll.
    context = browser.new_context(viewport={"width": 1440, "height": 2000})
    # Only the local server: the UI also calls a product-analytics host (sr-client-cfg.amplitude.com), and nothing
    # here may leave the machine.
    context.route(re.compile(r"^(?!https?://127\.0\.0\.1[:/])"), lambda route: route.abort())
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    try:
        yield page, history.url + prefix, shot_prefix
    finally:
        context.close()


def _shot(page: Page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / name
    page.screenshot(path=str(path), full_page=True)
    SCREENSHOTS.append(str(path))


def _open_report(page: Page, base: str, run: Run) -> Locator:
    """Open a run's report artifact; return its rendered markdown (the element holding the report's h1)."""
    page.goto(f"{base}/artifacts/artifact/{run.report_id}")
    headline = page.locator("h1", has_text=run.headline)
    expect(headline).to_be_visible(timeout=TIMEOUT_MS)
    return headline.locator("xpath=..")


def _wait_for_the_run_graph(page: Page) -> None:
    """Wait until the run graph has drawn its task runs. It is a WebGL canvas (@prefecthq/graphs, pixi.js) with no
    text to wait for, and its buffer is not kept for reading back, so this looks at what is on screen: screenshots
    of the canvas, decoded by the browser itself, until it holds a few thousand pixels of a state colour (the bars
    of completed task runs are saturated green). An empty canvas fails after TIMEOUT_MS."""
    canvas = page.locator("canvas").first
    expect(canvas).to_be_visible(timeout=TIMEOUT_MS)
    count_green = """async (png) => {
        const image = new Image();
        image.src = "data:image/png;base64," + png;
        await image.decode();
        const draw = document.createElement("canvas");
        [draw.width, draw.height] = [image.width, image.height];
        const context = draw.getContext("2d");
        context.drawImage(image, 0, 0);
        const pixels = context.getImageData(0, 0, image.width, image.height).data;
        let green = 0;
        for (let i = 0; i < pixels.length; i += 4) {
            if (pixels[i + 1] > pixels[i] + 60 && pixels[i + 1] > pixels[i + 2] + 40) green++;
        }
        return green;
    }"""
    deadline = time.monotonic() + TIMEOUT_MS / 1000
    green = 0
    while green < 3000:
        assert time.monotonic() < deadline, f"the run graph drew no task runs ({green} green pixels)"
        green = page.evaluate(count_green, base64.b64encode(canvas.screenshot()).decode())


def _phrase(message: str) -> str:
    """Plain words of a finding's message (the first run of at least three, at most eight): enough to find it on
    the page, clear of any markdown syntax (a quoted name or a code span renders differently)."""
    run: list[str] = []
    for word in message.split():
        if re.search(r"[`*_\"'<>\[\]|\\]", word):
            if len(run) >= 3:
                break
            run = []
            continue
        run.append(word)
        if len(run) == 8:
            break
    assert len(run) >= 3, f"no plain words in {message!r}"
    return " ".join(run)


def test_the_promoted_report_shows_its_headline_and_traffic(ui, history: History):
    page, base, shot = ui
    run = history.promoted
    assert "promoted" in run.headline.lower() and "not promoted" not in run.headline.lower(), run.headline
    report = _open_report(page, base, run)
    traffic = report.locator("td, th").filter(has_text=re.compile(r"^\s*traffic now\s*$"))
    expect(traffic.first).to_be_visible(timeout=TIMEOUT_MS)
    _shot(page, f"{shot}promoted-report.png")


def test_the_refusal_report_lists_every_finding(ui, history: History):
    page, base, shot = ui
    run = history.refused
    findings = FINDING.findall(run.state_message)
    assert findings, f"the refused run's exception lists no findings:\n{run.state_message}"
    report = _open_report(page, base, run)
    for _severity, setting, message in findings:
        # The setting a user has to change and the start of what to do about it, together in one item of the report
        # (the page's side panel repeats the run's state message, so only the rendered report counts).
        item = report.locator("li, tr, p, dd, div").filter(has_text=re.compile(rf"\b{re.escape(setting)}\b"))
        expect(item.filter(has_text=_phrase(message)).first).to_be_visible(timeout=TIMEOUT_MS)
    _shot(page, f"{shot}refusal-report.png")


def test_the_flow_run_page_shows_the_promoted_run(ui, history: History):
    page, base, shot = ui
    run = history.promoted
    page.goto(f"{base}/runs/flow-run/{run.id}")
    expect(page.get_by_text(run.name, exact=True).first).to_be_visible(timeout=TIMEOUT_MS)
    expect(page.get_by_text(run.state, exact=True).first).to_be_visible(timeout=TIMEOUT_MS)
    _wait_for_the_run_graph(page)
    # Where a user finds the report from the run: its Artifacts tab.
    page.get_by_role("tablist").get_by_text("Artifacts", exact=True).first.click()
    expect(page.get_by_text(run.report_key, exact=True).first).to_be_visible(timeout=TIMEOUT_MS)
    _shot(page, f"{shot}flow-run.png")


def test_the_run_logs_render(ui, history: History):
    page, base, shot = ui
    run = history.promoted
    # Our own INFO line (tasks/weights/staging.py): the product's logs reach the API despite the quiet console.
    staging = [entry["message"] for entry in history.logs if entry["message"].startswith("staging ")]
    assert staging, f"no 'staging ...' INFO line in {run.name}'s logs: {[e['message'] for e in history.logs]}"
    page.goto(f"{base}/runs/flow-run/{run.id}")
    # The run page's tabs (V2's are role=tab, V1's plain items of the role=tablist): open Logs as a user does.
    page.get_by_role("tablist").get_by_text("Logs", exact=True).first.click()
    beginning = page.get_by_text(f"Beginning flow run '{run.name}'")
    expect(beginning.first).to_be_visible(timeout=TIMEOUT_MS)
    line = page.get_by_text(staging[0].splitlines()[0][:80]).first
    expect(line).to_be_visible(timeout=TIMEOUT_MS)
    line.scroll_into_view_if_needed()
    _wait_for_the_run_graph(page)  # the top of the same page; a blank graph would look like a broken run
    _shot(page, f"{shot}run-logs.png")
