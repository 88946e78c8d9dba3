"""Shared fixtures for real-browser tests: JupyterLab on 127.0.0.1 driven by Debian's Chromium through Playwright.

Fixtures
  chromium_path   /usr/bin/chromium (or $HPU_NB_CHROMIUM), or a skip with the reason (run .ci/install_browser.sh).
  jupyter_lab     a JupyterLab server (session-wide): free port, a token, --allow-root as root, its own notebook,
                  settings and workspace folders, no news / update checks; `.url(path)`, `.notebook_dir`.
  browser         a headless Chromium (session-wide).
  lab             a fresh page on the lab with helpers (`LabPage`): open a notebook, wait for the kernel to be idle,
                  run cells, read outputs, take screenshots into the artifacts folder.
  artifacts_dir   where screenshots go: $HPU_NB_BROWSER_ARTIFACTS or <repo>/artifacts/browser (git-ignored).

Tests skip, with the reason printed, when Chromium, Playwright or JupyterLab cannot run here. Every browser test is
marked `browser` (deselect with -m "not browser").
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("HPU_NB_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--no-first-run", "--disable-sync", "--disable-dev-shm-usage"]
SERVER_START_TIMEOUT = 60.0


def pytest_collection_modifyitems(config: Any, items: list) -> None:
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).is_relative_to(here):
            item.add_marker(pytest.mark.browser)


def _skip(reason: str) -> None:
    print(f"\nSKIP browser tests: {reason}", file=sys.stderr)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def chromium_path() -> str:
    if not os.path.exists(CHROMIUM):
        _skip(f"{CHROMIUM} is missing: run `bash .ci/install_browser.sh` (installs Debian's chromium as root)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError as err:
        _skip(f"playwright is not installed ({err}); pip install playwright")
    return CHROMIUM


@pytest.fixture(scope="session")
def artifacts_dir() -> Path:
    path = Path(os.environ.get("HPU_NB_BROWSER_ARTIFACTS", REPO / "artifacts" / "browser"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class JupyterLab:
    """A running JupyterLab server (started by the `jupyter_lab` fixture)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.notebook_dir = root / "notebooks"
        self.notebook_dir.mkdir(parents=True, exist_ok=True)
        self.port = _free_port()
        self.token = uuid.uuid4().hex
        self.log_path = root / "jupyter.log"
        self.process: subprocess.Popen | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, path: str = "lab") -> str:
        sep = "&" if "?" in path else "?"
        return f"{self.base}/{path.lstrip('/')}{sep}token={self.token}"

    def start(self) -> None:
        settings = self.root / "lab-settings"
        (settings / "@jupyterlab" / "apputils-extension").mkdir(parents=True, exist_ok=True)
        (settings / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings").write_text(
            json.dumps({"fetchNews": "false", "checkForUpdates": False}))
        env = dict(os.environ)
        env.update({
            "JUPYTERLAB_SETTINGS_DIR": str(settings),
            "JUPYTERLAB_WORKSPACES_DIR": str(self.root / "lab-workspaces"),
            "JUPYTER_RUNTIME_DIR": str(self.root / "runtime"),
            "HPU_NB_BACKEND": "emulated",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])),
        })
        args = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={self.port}",
                f"--ServerApp.token={self.token}", f"--ServerApp.root_dir={self.notebook_dir}",
                "--ServerApp.port_retries=0", "--LabApp.expose_app_in_browser=True", "--LabApp.news_url=",
                "--ServerApp.terminals_enabled=False"]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            args.append("--allow-root")
        log = open(self.log_path, "w")  # noqa: SIM115 - closed in stop()
        self._log = log
        self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.notebook_dir)
        deadline = time.monotonic() + SERVER_START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"JupyterLab exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url("api/status"), timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                time.sleep(0.3)
        raise RuntimeError(f"JupyterLab did not answer within {SERVER_START_TIMEOUT:.0f} s:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)
        if getattr(self, "_log", None):
            self._log.close()

    def shutdown_kernels(self) -> None:
        """End every session (and its kernel), so the next test starts on a quiet server."""
        try:
            with urllib.request.urlopen(self.url("api/sessions"), timeout=5) as response:
                sessions = json.load(response)
            for session in sessions:
                request = urllib.request.Request(self.url(f"api/sessions/{session['id']}"), method="DELETE")
                urllib.request.urlopen(request, timeout=10).close()
        except OSError:
            pass

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_text()[-n:]
        except OSError:
            return ""

    def write_notebook(self, name: str, cells: list[str], kernel: str = "python3") -> Path:
        """A notebook of code cells (sources as strings); returns its path."""
        import nbformat

        nb = nbformat.v4.new_notebook()
        nb.metadata["kernelspec"] = {"name": kernel, "display_name": "Python 3", "language": "python"}
        nb.cells = [nbformat.v4.new_code_cell(src) for src in cells]
        path = self.notebook_dir / name
        nbformat.write(nb, path)
        return path


@pytest.fixture(scope="session")
def jupyter_lab(chromium_path: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[JupyterLab]:
    try:
        import jupyterlab  # noqa: F401
        import nbformat  # noqa: F401
    except ImportError as err:
        _skip(f"JupyterLab is not installed ({err})")
    server = JupyterLab(tmp_path_factory.mktemp("lab"))
    try:
        server.start()
    except RuntimeError as err:
        server.stop()
        _skip(f"JupyterLab could not start: {err}")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def browser(chromium_path: str) -> Iterator[Any]:
    from playwright.sync_api import Error, sync_playwright

    manager = sync_playwright()
    try:
        pw = manager.start()
    except Error as err:
        _skip(f"Playwright cannot start: {err}")
    try:
        chromium = pw.chromium.launch(executable_path=chromium_path, headless=True, args=CHROMIUM_ARGS)
    except Error as err:
        manager.__exit__(None, None, None)
        _skip(f"Chromium cannot start here: {str(err).splitlines()[0]}")
    yield chromium
    chromium.close()
    manager.__exit__(None, None, None)


class LabPage:
    """One browser page on JupyterLab, with the steps a notebook test needs (JupyterLab 4 app API)."""

    def __init__(self, page: Any, server: JupyterLab, artifacts: Path) -> None:
        self.page = page
        self.server = server
        self.artifacts = artifacts
        self.console: list[str] = []
        page.on("console", lambda msg: self.console.append(f"{msg.type}: {msg.text}"))
        page.on("pageerror", lambda err: self.console.append(f"pageerror: {err}"))

    def open_notebook(self, name: str, timeout: float = 60) -> None:
        """Open `name` (relative to the server's notebook dir) and wait until its kernel is idle."""
        # ?reset: start from an empty workspace, not the layout an earlier test left on the server
        self.page.goto(self.server.url(f"lab/tree/{name}?reset"), wait_until="domcontentloaded")
        self.page.wait_for_function(
            """(name) => { const app = window.jupyterapp; const w = app && app.shell.currentWidget;
                return w && w.context && w.context.path.endsWith(name) && w.content
                    && w.content.widgets.length > 0; }""",
            arg=name, timeout=timeout * 1000)
        self.wait_for_kernel_idle(timeout)

    def hide_side_panels(self) -> None:
        """Collapse the file browser so outputs get the page's width (nicer screenshots)."""
        self.page.evaluate("""() => { const shell = window.jupyterapp.shell;
            if (shell.leftCollapsed === false) shell.collapseLeft(); }""")

    def _kernel_status(self) -> str:
        return self.page.evaluate(
            """() => { const w = window.jupyterapp.shell.currentWidget;
                const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
                return k ? k.status : 'none'; }""")

    def wait_for_kernel_idle(self, timeout: float = 60) -> None:
        self.page.wait_for_function(
            """() => { const w = window.jupyterapp.shell.currentWidget;
                const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
                return k && k.status === 'idle' && !w.sessionContext.pendingInput; }""",
            timeout=timeout * 1000)

    def cell_count(self) -> int:
        return self.page.evaluate("() => window.jupyterapp.shell.currentWidget.content.widgets.length")

    def run_cell(self, index: int, wait: bool = True, timeout: float = 120) -> None:
        """Run cell `index`; with wait, return when it has an execution count and the kernel is idle again."""
        # not awaited: the command's promise settles only when the cell has finished
        self.page.evaluate(
            """(i) => { const app = window.jupyterapp; const nb = app.shell.currentWidget.content;
                nb.activeCellIndex = i; nb.widgets[i].model.sharedModel.execution_count = null;
                app.commands.execute('notebook:run-cell'); return true; }""", index)
        if wait:
            self.wait_for_cell(index, timeout)

    def wait_for_cell(self, index: int, timeout: float = 120) -> None:
        self.page.wait_for_function(
            """(i) => { const w = window.jupyterapp.shell.currentWidget; const cell = w.content.widgets[i];
                const k = w.sessionContext.session.kernel;
                return cell.model.executionCount !== null && k.status === 'idle'; }""",
            arg=index, timeout=timeout * 1000)

    def cell_source(self, index: int) -> str:
        return self.page.evaluate(
            "(i) => window.jupyterapp.shell.currentWidget.content.widgets[i].model.sharedModel.getSource()", index)

    def cell_text(self, index: int) -> str:
        """The visible text of a cell's output area."""
        return self.cell(index).locator(".jp-OutputArea").inner_text()

    def cell(self, index: int) -> Any:
        """Cell `index` of the notebook on show (other notebooks may be open in hidden tabs)."""
        return self.page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell").nth(index)

    def screenshot(self, name: str, locator: Any = None) -> Path:
        path = self.artifacts / f"{name}.png"
        (locator or self.page).screenshot(path=str(path))
        return path

    def publish(self, source: Path, name: str) -> Path | None:
        """With HPU_NB_UPDATE_SCREENSHOTS=1, copy a screenshot into docs/screenshots/ (the README's images)."""
        if os.environ.get("HPU_NB_UPDATE_SCREENSHOTS") != "1":
            return None
        target = REPO / "docs" / "screenshots" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        return target

    def save_console(self, name: str) -> Path:
        path = self.artifacts / f"{name}-console.txt"
        path.write_text("\n".join(self.console))
        return path


@pytest.fixture
def lab(browser: Any, jupyter_lab: JupyterLab, artifacts_dir: Path) -> Iterator[LabPage]:
    context = browser.new_context(viewport={"width": 1400, "height": 1000}, device_scale_factor=1)
    with contextlib.suppress(Exception):
        context.grant_permissions(["clipboard-read", "clipboard-write"], origin=jupyter_lab.base)
    page = context.new_page()
    page.set_default_timeout(60_000)
    yield LabPage(page, jupyter_lab, artifacts_dir)
    context.close()
    jupyter_lab.shutdown_kernels()

