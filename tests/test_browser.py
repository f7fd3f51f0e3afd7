"""The widget panels in a real browser: JupyterLab and the Voilà dashboard, driven by Playwright and Chromium.

Each test starts its own server (a free loopback port, a temporary root, no token, the smoke profile, kernels
from this Python), opens the page in headless Chromium kept off the network, runs the notebook, flips a toggle,
presses Run, and waits until the panel's count says the plot holds one more result and its image has changed.
In the dashboard, flipping a toggle must first change the code diff shown under the plot, before Run.
A screenshot of the panel goes to test-artifacts/; the server and its kernels are stopped even when a test fails.

The dashboard test serves it as `make dashboard` does for a room (the Makefile's DASHBOARD_ROOM options: culling,
a preheated kernel, no network), prints how soon a page is usable and the memory one participant's kernel takes,
and checks that closed tabs leave no kernel behind.

The tests skip when Playwright, Chromium, JupyterLab or Voilà is missing, unless FASTLAB_REQUIRE_BROWSER=1
(set by .ci/run, which installs them): then a missing piece is a failure, so CI cannot pass by skipping.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
ARTIFACTS = ROOT / "test-artifacts"
# The notebook whose panel the JupyterLab test drives; one line to point it elsewhere.
LAB_NOTEBOOKS = ["01_data_loading.ipynb"]
DASHBOARD = "dashboard.ipynb"

# Chromium stays on the machine: no background services, no updates, and any host but loopback goes to a
# dead proxy and resolves to nothing (loopback bypasses the proxy by Chromium's own rule).
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
    "--disable-default-apps", "--disable-extensions", "--proxy-server=http://127.0.0.1:9",
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
]
SERVER_START_S = 90  # server up and listening
PAGE_LOAD_MS = 90_000  # page (JupyterLab shell, or Voilà after executing the notebook) rendered
RUN_ALL_MS = 300_000  # every cell run and the panel shown (a minute or two unloaded; headroom for a busy machine)
PANEL_RUN_MS = 180_000  # one press of Run (three runs: A/B/A), measured and redrawn
KERNELS_GONE_S = 240  # closed tabs' kernels culled (the Makefile culls after 60 s idle, checking every 10 s)
COUNT = re.compile(r"(\d+) results? in the plot")
RUN_LABEL = re.compile(r"^\s*Run\s*$")

# JupyterLab user settings for the test server: no news or update checks (no network, no toast over the
# panel), and every cell kept in the page (no virtual scrolling) so the panel can be found wherever it is.
LAB_SETTINGS = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings":
        '{"fetchNews": "false", "checkForUpdates": false, "doNotDisturbMode": true}',
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": '{"windowingMode": "none"}',
}


def missing(what: str) -> None:
    """Skip for a missing browser piece, or fail where the browser test is required (CI)."""
    if os.environ.get("FASTLAB_REQUIRE_BROWSER") == "1":
        pytest.fail(f"FASTLAB_REQUIRE_BROWSER=1 but {what}")
    pytest.skip(what)


def chromium_path() -> str | None:
    """FASTLAB_CHROMIUM, else Debian's chromium on PATH or at /usr/bin/chromium."""
    given = os.environ.get("FASTLAB_CHROMIUM")
    if given:
        return given if os.access(given, os.X_OK) else None
    return shutil.which("chromium") or (
        "/usr/bin/chromium" if os.access("/usr/bin/chromium", os.X_OK) else None)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def log_tail(path: Path, chars: int = 3000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else "(no log)"


def wait_for_port(port: int, proc: subprocess.Popen, log: Path, timeout: float) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with code {proc.returncode} before listening:\n{log_tail(log)}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        time.sleep(0.5)
    raise TimeoutError(f"the server did not listen on port {port} within {timeout:.0f} s:\n{log_tail(log)}")


def stop_process_tree(proc: subprocess.Popen, timeout: float = 20.0) -> None:
    """Stop a server and everything it started (kernels run in sessions of their own, so not by group)."""
    try:
        children = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        children = []
    if proc.poll() is None:
        proc.terminate()  # the Jupyter server shuts its kernels down on SIGTERM
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)
    _, alive = psutil.wait_procs(children, timeout=2)
    for signal_child in ("terminate", "kill"):  # what the server left behind: asked first, then forced
        for child in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                getattr(child, signal_child)()
        _, alive = psutil.wait_procs(alive, timeout=timeout / 2)


@contextlib.contextmanager
def serve(command: list[str], root: Path, name: str, **extra_env: str) -> Iterator[tuple[str, subprocess.Popen]]:
    """Run a server command (with {port} filled in) from `root`; yield its URL and process; always stop it."""
    port = free_port()
    home = root / ".jupyter-home"  # config, runtime and settings of this server only
    settings = home / "lab-settings"
    for relative, text in LAB_SETTINGS.items():
        (settings / relative).parent.mkdir(parents=True, exist_ok=True)
        (settings / relative).write_text(text)
    env = dict(os.environ, FASTLAB_PROFILE="smoke", MPLBACKEND="module://matplotlib_inline.backend_inline",
               JUPYTER_CONFIG_DIR=str(home / "config"), JUPYTER_DATA_DIR=str(home / "data"),
               JUPYTER_RUNTIME_DIR=str(home / "runtime"),
               JUPYTERLAB_SETTINGS_DIR=str(settings), JUPYTERLAB_WORKSPACES_DIR=str(home / "workspaces"),
               PYTHONUNBUFFERED="1", **extra_env)
    ARTIFACTS.mkdir(exist_ok=True)
    log = ARTIFACTS / f"{name}-server.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([c.format(port=port) for c in command], cwd=root, env=env, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        wait_for_port(port, proc, log, SERVER_START_S)
        yield f"http://127.0.0.1:{port}", proc
    finally:
        stop_process_tree(proc)


@pytest.fixture(scope="module")
def browser():
    if importlib.util.find_spec("playwright") is None:
        missing("the playwright package is not installed (pip install playwright; no browser download needed)")
    executable = chromium_path()
    if executable is None:
        missing("Chromium is not installed (apt-get install -y chromium, or set FASTLAB_CHROMIUM)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1400, "height": 1000}, service_workers="block")
    pg = context.new_page()
    pg.set_default_timeout(PAGE_LOAD_MS)
    try:
        yield pg
    finally:
        context.close()


@contextlib.contextmanager
def screenshot_on_failure(page, name: str) -> Iterator[None]:
    """On any failure, a screenshot of the whole page, to see what the test was waiting for."""
    try:
        yield
    except BaseException:
        with contextlib.suppress(Exception):  # a failed screenshot must not hide the test's own error
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / f"{name}-failure.png"), full_page=True)
        raise


@contextlib.contextmanager
def server_root(*notebooks: str) -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="fastlab-browser-") as tmp:
        for nb in notebooks:
            shutil.copy(NOTEBOOKS / nb, Path(tmp) / nb)
        yield Path(tmp)


def panel_locator(page):
    """The panel: the widget box that holds the 'N results in the plot' count (the outermost one)."""
    return page.locator(".widget-vbox").filter(has=page.locator(".widget-label", has_text=COUNT)).first


def result_count(panel) -> int:
    text = panel.locator(".widget-label", has_text=COUNT).first.inner_text()
    return int(COUNT.search(text).group(1))


def image_source(panel) -> str:
    return panel.locator("img").first.get_attribute("src") or ""


def run_and_wait(panel, before: int, knob: str) -> bool:
    """Press Run with `knob` changed: True once a result is added, False when the panel says the change is a no-op
    here (nothing trained, and why)."""
    run_button = panel.locator(".widget-button").filter(has_text=RUN_LABEL).first
    assert run_button.is_enabled(), "Run is disabled before pressing it"
    run_button.click()
    added = panel.locator(".widget-label", has_text=re.compile(rf"^{before + 1} results? in the plot"))
    not_trained = panel.locator(".widget-html", has_text=f"no-op here ({knob}:")  # this knob's, never a stale one
    try:
        added.or_(not_trained).first.wait_for(state="visible", timeout=PANEL_RUN_MS)
    except Exception as e:
        status = panel.locator(".widget-html").first.inner_text()
        raise AssertionError(f"Run did not add a result within {PANEL_RUN_MS // 1000} s "
                             f"(still {result_count(panel)}; panel says: {status!r})") from e
    if added.count():
        return True
    assert "Not trained" in not_trained.first.inner_text() and result_count(panel) == before
    return False


def press_run_and_wait(page, panel, name: str) -> None:
    """Flip the first toggle, press Run, wait for one more result and a new image; screenshot the panel. Where that
    toggle is a no-op here (pin_memory on a CPU) the panel trains nothing and says why: flip it back, choose the
    first dropdown's next option instead (one change at a time) and Run again."""
    before, image_before = result_count(panel), image_source(panel)
    toggle = panel.locator(".widget-checkbox").first
    knob, checkbox = toggle.inner_text().strip(), toggle.locator("input")
    was = checkbox.is_checked()
    checkbox.click()
    assert checkbox.is_checked() != was, "the toggle did not change"
    if not run_and_wait(panel, before, knob):
        print(f"\n{knob} is a no-op here: the panel trained nothing and said why")
        checkbox.click()  # back to the baseline
        dropdown = panel.locator(".widget-dropdown").first
        knob, select = dropdown.locator("label").inner_text().strip(), dropdown.locator("select")
        options = select.locator("option").count()
        select.select_option(index=(select.evaluate("s => s.selectedIndex") + 1) % options)
        assert run_and_wait(panel, before, knob), f"choosing another {knob} trained nothing"
    page.wait_for_function("([img, old]) => img.src && img.src !== old",
                           arg=[panel.locator("img").first.element_handle(), image_before], timeout=10_000)
    assert "Run failed" not in panel.inner_text()
    panel.scroll_into_view_if_needed()
    panel.screenshot(path=str(ARTIFACTS / f"{name}-panel.png"))


def code_shown(panel) -> str:
    return panel.locator(".fastlab-code").first.inner_text()


def knob_changes_the_code_before_run(page, panel) -> None:
    """Flip the first toggle: the code under the plot shows its diff before any Run; flip it back: no change."""
    before, count = code_shown(panel), result_count(panel)
    assert "no change from the baseline" in before, f"the page opened with a diff: {before[:300]!r}"
    checkbox = panel.locator(".widget-checkbox input").first
    checkbox.click()
    code = panel.locator(".fastlab-code").first
    page.wait_for_function("([el, old]) => el.innerText !== old", arg=[code.element_handle(), before],
                           timeout=30_000)
    changed = code_shown(panel)
    assert "no change from the baseline" not in changed and re.search(r"^\+", changed, re.MULTILINE), changed[:500]
    assert result_count(panel) == count, "changing a knob ran something"
    panel.scroll_into_view_if_needed()
    panel.screenshot(path=str(ARTIFACTS / "voila-dashboard-code.png"))
    checkbox.click()
    page.wait_for_function("el => el.innerText.includes('no change from the baseline')", arg=code.element_handle(),
                           timeout=30_000)


def kernel_ready(page) -> None:
    """Wait until the notebook's kernel is idle, accepting the default in a 'Select Kernel' dialog if one shows."""
    idle = page.locator(".jp-StatusBar-TextItem", has_text=re.compile(r"\|\s*Idle"))
    accept = page.locator(".jp-Dialog .jp-Dialog-button.jp-mod-accept")
    end = time.monotonic() + PAGE_LOAD_MS / 1000
    while time.monotonic() < end:
        if accept.count() and accept.first.is_visible():
            accept.first.click()
        if idle.count():
            return
        page.wait_for_timeout(500)
    raise AssertionError(f"the kernel was not idle within {PAGE_LOAD_MS // 1000} s of opening the notebook")


def run_all_finished(page):
    """Run All Cells, wait until no cell is queued or running ('[*]'), then return the panel.

    A cell that raises stops Run All: the test then fails at once with the notebook's error output,
    instead of waiting out the timeout for a panel that will never come.
    """
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()
    running = "() => [...document.querySelectorAll('.jp-InputPrompt')].some(p => p.textContent.includes('*'))"
    page.wait_for_function(running, timeout=60_000)  # Run All marks every code cell queued at once
    page.wait_for_function(f"() => !({running})()", timeout=RUN_ALL_MS, polling=1000)
    panel = panel_locator(page)
    if not panel.is_visible():
        errors = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
        raise AssertionError("Run All ended without showing a panel; stderr outputs:\n"
                             + "\n".join(errors.all_inner_texts())[-3000:])
    return panel


@pytest.mark.browser
@pytest.mark.parametrize("notebook", LAB_NOTEBOOKS)
def test_panel_runs_in_jupyterlab(page, notebook):
    if not (NOTEBOOKS / notebook).exists():
        pytest.skip(f"notebooks/{notebook} does not exist yet")
    if importlib.util.find_spec("jupyterlab") is None:
        missing("jupyterlab is not installed")
    command = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1", "--port={port}",
               "--ServerApp.token=", "--ServerApp.password=", "--ServerApp.root_dir=.", "--allow-root",
               "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    name = f"lab-{Path(notebook).stem}"
    with server_root(notebook) as root, serve(command, root, name) as (url, _), screenshot_on_failure(page, name):
        page.goto(f"{url}/lab/tree/{notebook}")
        page.locator(".jp-Notebook").first.wait_for(state="visible")
        page.locator(".jp-Notebook-cell").first.wait_for(state="visible")
        kernel_ready(page)
        panel = run_all_finished(page)
        press_run_and_wait(page, panel, name)


def room_options() -> list[str]:
    """The options `make dashboard` serves a room with (the Makefile's DASHBOARD_ROOM): the test checks those."""
    found = re.search(r"^DASHBOARD_ROOM := (.+)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert found, "the Makefile has no DASHBOARD_ROOM line"
    return found.group(1).split()


def kernels(server: subprocess.Popen) -> list[psutil.Process]:
    """The server's running kernels."""
    found = []
    for child in psutil.Process(server.pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if "ipykernel_launcher" in " ".join(child.cmdline()) and child.status() != psutil.STATUS_ZOMBIE:
                found.append(child)
    return found


def wait_until_preheated(server: subprocess.Popen, timeout: float) -> float:
    """Seconds until the pool's kernel has executed the notebook: a kernel whose CPU time stops growing."""
    start, last, quiet_since = time.monotonic(), None, None
    while time.monotonic() - start < timeout:
        found = kernels(server)
        with contextlib.suppress(psutil.Error):
            used = sum(found[0].cpu_times()[:2]) if len(found) == 1 else None
            if used is not None and used == last:
                quiet_since = quiet_since or time.monotonic()
                if time.monotonic() - quiet_since >= 3:
                    return quiet_since - start
            else:
                quiet_since = None
            last = used
        time.sleep(0.5)
    raise TimeoutError(f"the preheated kernel was still busy {timeout:.0f} s after the server started")


LOCAL = ("http://127.0.0.1", "ws://127.0.0.1", "data:", "blob:")


def open_dashboard(browser, url: str, outside: list[str]):
    """A new tab on the dashboard; returns (context, page, panel, seconds until Run could be pressed)."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000}, service_workers="block")

    def note(request) -> None:
        if not request.url.startswith(LOCAL):
            outside.append(request.url)

    context.on("request", note)
    page = context.new_page()
    start = time.monotonic()
    page.goto(url + "/", timeout=PAGE_LOAD_MS)
    panel = panel_locator(page)
    panel.wait_for(state="visible", timeout=RUN_ALL_MS)
    page.wait_for_function("b => !b.disabled", arg=panel.locator(".widget-button").filter(
        has_text=RUN_LABEL).first.element_handle(), timeout=PAGE_LOAD_MS)
    return context, page, panel, time.monotonic() - start


def report_memory(server: subprocess.Popen) -> None:
    """Print each kernel's memory, with its forkserver (fastlab.isolation: it holds torch once more), and what
    that means for a room on this machine. A kernel's RSS plus its children's own pages (USS): the server shares
    torch's libraries with the kernel, so its RSS would count them twice."""
    def with_children(k: psutil.Process) -> float:
        own = 0.0
        for child in k.children(recursive=True):
            try:
                own += child.memory_full_info().uss
            except psutil.Error:
                pass
        return (k.memory_info().rss + own) / 2**30

    sizes = sorted((with_children(k) for k in kernels(server)), reverse=True)
    total = psutil.virtual_memory().total / 2**30
    used = sizes[0]  # the kernel that ran (the preheated one waiting has run only the page-load baseline)
    room = int((0.9 * total - used) / used)  # 10% for the system, one kernel waiting preheated
    print(f"\nkernel RSS + its processes' own memory after a Run (GiB): {', '.join(f'{s:.2f}' for s in sizes)}; one "
          f"machine of {total:.0f} GiB holds about {room} participants at {used:.2f} GiB each (10% kept for the "
          "system, one kernel preheated; a run in progress adds its process's own pages, 0.1-0.3 GiB)")


@pytest.mark.browser
def test_dashboard_serves_a_room_in_voila(browser):
    """As `make dashboard` serves it: a page is usable soon (preheated kernel), Run works, nothing is fetched from
    the network, and three tabs opened and closed leave no kernel of theirs behind (culled)."""
    if importlib.util.find_spec("voila") is None:
        missing("voila is not installed (pip install voila)")
    command = [sys.executable, "-m", "voila", "--no-browser", "--Voila.ip=127.0.0.1", "--port={port}",
               "--Voila.port_retries=0", *room_options(), DASHBOARD]
    outside: list[str] = []
    with server_root(DASHBOARD) as root, serve(command, root, "voila-dashboard",
                                               JUPYTER_PATH=str(ROOT / "share" / "jupyter")) as (url, server):
        pool = wait_until_preheated(server, RUN_ALL_MS / 1000)
        print(f"\npreheated kernel ready (the notebook executed) {pool:.0f} s after the server started")
        tabs = [open_dashboard(browser, url, outside)]
        context, page, panel, usable = tabs[0]
        print(f"page usable (Run enabled) {usable:.1f} s after opening it (preheated kernel)")
        with screenshot_on_failure(page, "voila-dashboard"):
            # an app: the code is hidden, only prose and outputs show
            assert page.locator(".jp-InputArea-editor, .jp-CodeMirrorEditor").count() == 0
            assert "from fastlab.widgets import Panel" not in page.content()
            knob_changes_the_code_before_run(page, panel)
            press_run_and_wait(page, panel, "voila-dashboard")
            assert "measured beside it" in panel.inner_text()
        report_memory(server)
        for _ in range(2):
            tabs.append(open_dashboard(browser, url, outside))
            print(f"another tab usable {tabs[-1][3]:.1f} s after opening it")
        opened = len(kernels(server))
        for context, *_ in tabs:
            context.close()
        start, left = time.monotonic(), opened
        while time.monotonic() - start < KERNELS_GONE_S:
            left = len(kernels(server))
            if left <= 1:  # the preheated kernel waiting for the next participant
                break
            time.sleep(2)
        print(f"three tabs closed: {opened} kernels -> {left} after {time.monotonic() - start:.0f} s")
        assert left <= 1, f"{left} kernels still running {KERNELS_GONE_S} s after the tabs closed"
    assert not outside, f"the dashboard fetched from outside this machine: {sorted(set(outside))[:5]}"


def test_stopping_a_server_also_stops_what_it_started():
    """The fixture's clean-up: a parent whose child runs in a session of its own (like a kernel) both end."""
    script = ("import subprocess, sys, time\n"
              "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], start_new_session=True)\n"
              "print(child.pid, flush=True)\n"
              "time.sleep(120)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    child_pid = int(proc.stdout.readline())
    assert psutil.pid_exists(child_pid)
    stop_process_tree(proc, timeout=10)
    proc.stdout.close()
    assert proc.poll() is not None
    assert not psutil.pid_exists(child_pid) or psutil.Process(child_pid).status() == psutil.STATUS_ZOMBIE
