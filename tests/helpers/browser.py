"""optuna-dashboard in a real browser: Debian's headless Chromium driven by selenium through Debian's chromedriver
(nothing downloads a browser or a driver). The browser test and accrot/sweep/README.md's screenshot share this code
path:

    python -m tests.helpers.browser sqlite:///runs/sweeps/smoke/study.db runs/sweeps/smoke/artifacts .github/dashboard.png
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

CHROMIUM = ("chromium", "chromium-browser", "google-chrome")
DRIVER = "chromedriver"


def missing_browser() -> str | None:
    """Why the browser cannot run here (one line), or None."""
    if not any(shutil.which(b) for b in CHROMIUM):
        return "no Chromium (apt-get install chromium chromium-driver)"
    if shutil.which(DRIVER) is None:
        return "no chromedriver (apt-get install chromium-driver)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[dev]')"
    return None


def free_port() -> int:
    import socket

    with contextlib.closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def dashboard(url: str, artifacts: Path, timeout: float = 90) -> Iterator[str]:
    """optuna-dashboard (the venv's, as `make dashboard` runs it) on a free port; yields its base URL."""
    port = free_port()
    exe = Path(sys.executable).parent / "optuna-dashboard"
    proc = subprocess.Popen([str(exe), url, "--artifact-dir", str(artifacts), "--host", "127.0.0.1", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"optuna-dashboard exited with {proc.returncode}")
            try:
                with urllib.request.urlopen(f"{base}/api/studies", timeout=5):
                    break
            except OSError:
                if time.time() > deadline:
                    raise RuntimeError(f"optuna-dashboard did not answer in {timeout:.0f} s") from None
                time.sleep(0.3)
        yield base
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(30)


def api(base: str, path: str) -> dict:
    with urllib.request.urlopen(f"{base}/api/{path}", timeout=30) as resp:
        return json.loads(resp.read())


@contextlib.contextmanager
def chromium(width: int = 1500, height: int = 1700) -> Iterator:
    """A headless Chromium session (selenium WebDriver) from the system's browser and driver."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    os.environ.setdefault("SE_OFFLINE", "true")  # selenium-manager never fetches a browser or a driver
    options = webdriver.ChromeOptions()
    options.binary_location = next(shutil.which(b) for b in CHROMIUM if shutil.which(b))
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                f"--window-size={width},{height}", "--hide-scrollbars"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=shutil.which(DRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()


@dataclass
class Rendered:
    study_list: str  # the text of the study list page
    image_width: int  # the artifact image's natural width as the browser decoded it (0: not rendered)
    note: str  # the text of the trial's rendered note
    screenshot: Path


def render_trial(driver, base: str, study: str, out: Path, timeout: float = 60) -> Rendered:
    """Open the study list, then the first complete trial of ``study`` with its artifacts and note; wait until the
    artifact image is decoded and the note rendered; screenshot the trial's page into ``out``."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(driver, timeout)
    driver.get(f"{base}/dashboard")
    wait.until(lambda d: study in d.find_element(By.TAG_NAME, "body").text)
    study_list = driver.find_element(By.TAG_NAME, "body").text
    (summary,) = [s for s in api(base, "studies")["study_summaries"] if s["study_name"] == study]
    trial = next(t for t in api(base, f"studies/{summary['study_id']}")["trials"] if t["state"] == "Complete")
    driver.get(f"{base}/dashboard/studies/{summary['study_id']}/trials?numbers={trial['number']}")

    def image(d) -> int:
        for img in d.find_elements(By.CSS_SELECTOR, "img[src*='/artifacts/']"):
            if d.execute_script("return arguments[0].complete && arguments[0].naturalWidth", img):
                return int(d.execute_script("return arguments[0].naturalWidth", img))
        return 0

    width = wait.until(image)
    heading = wait.until(lambda d: next((h.text for h in d.find_elements(By.TAG_NAME, "h3") if "seed" in h.text), None))
    out.parent.mkdir(parents=True, exist_ok=True)
    time.sleep(0.5)  # the layout settles before the picture is taken
    driver.save_screenshot(str(out))
    return Rendered(study_list, width, heading, out)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3:
        print("usage: python -m tests.helpers.browser STORAGE_URL ARTIFACT_DIR OUT.png", file=sys.stderr)
        return 2
    why = missing_browser()
    if why:
        print(f"tests.helpers.browser: {why}", file=sys.stderr)
        return 2
    url, artifacts, out = args[0], Path(args[1]), Path(args[2])
    study = url.rstrip("/").rsplit("/", 2)[-2] if url.startswith("sqlite:") else "smoke"
    with dashboard(url, artifacts) as base, chromium() as driver:
        rendered = render_trial(driver, base, study, out)
    print(f"{rendered.screenshot}: artifact image {rendered.image_width} px wide, note {rendered.note!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
