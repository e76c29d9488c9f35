"""A reader's first minute with the timeline explorer, and every label of the walk-through, in a real browser.

JupyterLab is started on a free localhost port (no token, no password) over a scratch
copy of ``notebooks/``; Debian's headless Chromium, driven by Playwright, opens
``02_timeline_explorer.ipynb``, runs every cell from the Run menu, waits for the panel's
headline numbers, moves the bandwidth slider with the keyboard, and checks that the
displayed step time changed.  Then each notebook of the course's walk-through that draws
widgets is run the same way, screenshotted, and checked for words their box cuts (a label,
a readout, a button or a panel's table cell narrower than its text).  The screenshots land in
``tests/artifacts/``.

The test skips, saying why, only when Chromium or Playwright is missing or cannot start;
``make test`` installs Chromium first (``make browser-deps``).  Playwright's own browser
downloads are never used.  Every wait is bounded, and an alarm stops the whole test after
a few minutes so it can never hang CI.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "tests" / "artifacts"
NOTEBOOK = "02_timeline_explorer.ipynb"
HARD_LIMIT_S = 300
# Without the background-networking flags Chromium tries to reach Google services and,
# on a closed network, its connections are refused; a fresh profile keeps runs independent.
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage",
]
STEP_TIME = re.compile(r"step time\s+([0-9.,]+)\s*ms")


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return "/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def hard_deadline():
    """Fail (never hang) if the whole test runs past HARD_LIMIT_S."""

    def expired(signum, frame):
        raise TimeoutError(f"browser test ran past its {HARD_LIMIT_S} s limit")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(HARD_LIMIT_S)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


@pytest.fixture(scope="module")
def jupyter_lab(tmp_path_factory):
    """A JupyterLab server on a scratch copy of the notebooks (one for the module); yields its URL."""
    tmp_path = tmp_path_factory.mktemp("lab")
    root = tmp_path / "notebooks"
    shutil.copytree(ROOT / "notebooks", root, ignore=shutil.ignore_patterns(".ipynb_checkpoints", "out"))
    port = _free_port()
    env = dict(os.environ)
    settings = tmp_path / "lab-settings"
    # Render every cell (no virtual scrolling, so the panel stays in the page after Run All
    # scrolls to the end), and ask no questions about news.
    for plugin, values in {"notebook-extension/tracker": '{"windowingMode": "none"}',
                           "apputils-extension/notification": '{"fetchNews": "false"}'}.items():
        f = settings / "@jupyterlab" / f"{plugin}.jupyterlab-settings"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(values)
    env.update({"JUPYTER_CONFIG_DIR": str(tmp_path / "config"),
                "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
                "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "workspaces"),
                "JUPYTERLAB_SETTINGS_DIR": str(settings),
                "JUPYTER_PLATFORM_DIRS": "1"})
    log = open(tmp_path / "jupyterlab.log", "w")  # noqa: SIM115 - closed in the finalizer below
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
         "--IdentityProvider.token=", "--ServerApp.password=", "--ServerApp.disable_check_xsrf=True",
         f"--ServerApp.root_dir={root}", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
         *(["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else [])],
        stdout=log, stderr=subprocess.STDOUT, env=env, cwd=root, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                log = (tmp_path / "jupyterlab.log").read_text()
                pytest.fail(f"JupyterLab exited with {proc.returncode}:\n{log}")
            try:
                with urllib.request.urlopen(f"{url}/api/status", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("JupyterLab did not answer within 60 s")
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
        log.close()


def _launch(playwright, profile: str):
    chromium = _chromium()
    if chromium is None:
        pytest.skip("Debian's chromium is not installed (run `make browser-deps` as root)")
    try:
        return playwright.chromium.launch_persistent_context(
            profile, executable_path=chromium, headless=True, args=CHROMIUM_ARGS,
            viewport={"width": 1400, "height": 1000}, timeout=60_000)
    except Exception as exc:  # noqa: BLE001 - any launch failure means "this machine cannot run a browser"
        pytest.skip(f"playwright could not launch {chromium}: {str(exc).splitlines()[0]}")


def _open_and_run_all(page, url: str, sync_api) -> None:
    """Open a notebook, wait for its kernel, and start Run > Run All Cells as a reader would.

    ``?reset`` starts from an empty workspace: the server is shared by the module's tests, and
    without it JupyterLab reopens the notebooks an earlier test had open beside this one."""
    page.goto(f"{url}?reset")
    # The notebook is open and its kernel is ready.
    page.wait_for_selector(".jp-NotebookPanel .jp-Cell")
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=90_000)

    # Run > Run All Cells.  The menu item stays disabled until the notebook is the active
    # document with a kernel, so focus it first and retry until the first code cell has started.
    page.locator(".jp-NotebookPanel .jp-Cell").first.click()
    started = "() => [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')]" \
              ".some(p => /\\[(\\*|\\d+)\\]/.test(p.textContent))"
    for _attempt in range(5):
        page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
        item = page.locator(".lm-Menu-item", has_text=re.compile(r"^Run All Cells"))
        item.wait_for(state="visible")
        if "lm-mod-disabled" in (item.get_attribute("class") or ""):
            page.keyboard.press("Escape")
            page.wait_for_timeout(1000)
            continue
        item.click()
        try:
            page.wait_for_function(started, timeout=10_000)
            return
        except sync_api.TimeoutError:
            continue
    pytest.fail("Run > Run All Cells never started the notebook's cells")


def _step_ms(page) -> float | None:
    text = page.locator(".zs-metrics").first.text_content() or ""
    m = STEP_TIME.search(text)
    return float(m.group(1).replace(",", "")) if m else None


@contextlib.contextmanager
def _page_after_run_all(url: str, failure: Path):
    """A fresh browser's page on the notebook at ``url`` after Run > Run All Cells, closed afterwards;
    if anything in the ``with`` block fails, what the page showed is saved to ``failure`` first."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_api.sync_playwright() as pw, tempfile.TemporaryDirectory() as profile:
        context = _launch(pw, profile)
        try:
            page = context.pages[0] if context.pages else context.new_page()
            page.set_default_timeout(60_000)
            _open_and_run_all(page, url, sync_api)
            yield page
        except BaseException:
            # What the page looked like when it went wrong: the first thing to look at.
            with contextlib.suppress(Exception):
                page.screenshot(path=str(failure), full_page=True)
            raise
        finally:
            context.close()


def test_moving_the_bandwidth_slider_changes_the_step_time(jupyter_lab, hard_deadline):
    with _page_after_run_all(f"{jupyter_lab}/lab/tree/{NOTEBOOK}",
                             ARTIFACTS / "02_timeline_explorer-failure.png") as page:
        metrics = page.locator(".zs-metrics").first
        metrics.wait_for(state="attached", timeout=90_000)
        page.wait_for_function(
            "() => /step time\\s+[0-9.]+\\s*ms/"
            ".test(document.querySelector('.zs-metrics')?.textContent || '')",
            timeout=60_000)
        metrics.scroll_into_view_if_needed()
        before = _step_ms(page)
        assert before is not None and before > 0

        # Move the bandwidth slider: focus its handle and page down (noUiSlider's keyboard support).
        handle = page.locator(".zs-bandwidth .noUi-handle").first
        handle.scroll_into_view_if_needed()
        handle.focus()
        pressed = time.monotonic()
        for _ in range(3):
            page.keyboard.press("PageDown")
        page.wait_for_function(
            "(before) => { const m = /step time\\s+([0-9.]+)\\s*ms/.exec("
            "document.querySelector('.zs-metrics')?.textContent || ''); "
            "return m && Math.abs(parseFloat(m[1]) - before) > 1e-6; }",
            arg=before, timeout=60_000)
        latency_s = time.monotonic() - pressed
        after = _step_ms(page)
        assert after is not None and after != before, f"step time stayed at {before} ms"
        # Less bandwidth, longer step: the explorer showed the new scenario, not a stale one.
        assert after > before, f"bandwidth went down but the step went from {before} to {after} ms"
        # The live matplotlib canvas rendered too.
        assert page.locator(".zs-timeline-explorer canvas").count() > 0
        page.wait_for_timeout(500)
        page.screenshot(path=str(ARTIFACTS / "02_timeline_explorer.png"), full_page=True)
        print(f"step time {before} ms -> {after} ms after lowering the bandwidth "
              f"(first new number on screen {latency_s * 1e3:.0f} ms after the key press)")


# The notebooks of the course's walk-through that draw widgets, each run in the browser, screenshotted,
# and checked for words that do not fit their box.
LABELLED = ("00_quickstart", "09_play_a_step_and_check_yourself", "02_timeline_explorer",
            "05_zero3_on_slow_networks", "07_planner", "10_bring_your_own_trace")
# Every widget's words whose box is narrower than they are (the browser then cuts them with "…"):
# labels, readouts, buttons, checkbox descriptions and the panels' HTML tables.
CUT_WORDS = """() => [...document.querySelectorAll(
    '.widget-label, .widget-label-basic span, .widget-readout, .widget-button, .widget-toggle-button, '
    + '.widget-html-content td, .widget-html-content th')]
  .filter(e => e.offsetParent !== null && e.textContent.trim() && e.scrollWidth > e.clientWidth + 1)
  .map(e => e.textContent.trim())"""
DONE = """() => document.querySelector(".jp-Notebook-ExecutionIndicator")?.dataset.status === "idle"
  && ![...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')].some(p => p.textContent.includes('*'))"""


@pytest.mark.parametrize("stem", LABELLED)
def test_every_label_fits_its_box_after_run_all(jupyter_lab, hard_deadline, stem):
    notebook = f"{jupyter_lab}/lab/tree/{stem}.ipynb"
    with _page_after_run_all(notebook, ARTIFACTS / f"{stem}-failure.png") as page:
        page.wait_for_function(DONE, timeout=180_000)
        page.wait_for_timeout(1000)  # the last widgets render
        page.screenshot(path=str(ARTIFACTS / f"{stem}.png"), full_page=True)
        cut = page.evaluate(CUT_WORDS)
        assert not cut, f"{stem}: words cut by their box at JupyterLab's default width: {cut}"
