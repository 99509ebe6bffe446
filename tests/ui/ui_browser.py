"""Headless Debian chromium driven through its matching chromedriver (Selenium), with waits on rendered text
and screenshots kept as test artifacts."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

INSTALL_SCRIPT = Path(__file__).with_name("install_browser.sh")
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
# What works here: no sandbox as root, no GPU, and nothing that phones home (there is no network).
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage")
VIEWPORT = {"width": 1600, "height": 1000, "deviceScaleFactor": 1, "mobile": False}


def ensure_chromium() -> None:
    """Install Debian's chromium and chromium-driver when they are missing (idempotent)."""
    if Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists():
        return
    result = subprocess.run(["bash", str(INSTALL_SCRIPT)], capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        raise RuntimeError(f"{INSTALL_SCRIPT} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")


@contextmanager
def chromium() -> Iterator:
    """A fresh headless chromium (own profile directory), quit on exit."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    ensure_chromium()
    profile = Path(tempfile.mkdtemp(prefix="chromium-profile-"))
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    # An explicit driver path keeps Selenium Manager from trying to download one.
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(120)
    # An exact viewport (--window-size includes browser chrome) so screenshots are the same size every run.
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", VIEWPORT)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def page_text(driver) -> str:
    return driver.execute_script("return document.body ? document.body.innerText : ''") or ""


def wait_for(driver, condition: Callable[[str], bool], what: str, timeout_s: float = 90) -> str:
    """Wait until `condition(page text)` holds; fail saying `what` was expected and what the page showed."""
    deadline = time.monotonic() + timeout_s
    while True:
        text = page_text(driver)
        if condition(text):
            return text
        if time.monotonic() > deadline:
            raise AssertionError(f"{driver.current_url} never showed {what} within {timeout_s:.0f} s; "
                                 f"page text starts with: {text[:1500]!r}")
        time.sleep(0.5)


def wait_for_texts(driver, texts: list[str], timeout_s: float = 90) -> str:
    """Wait until every one of `texts` is in the rendered page."""
    return wait_for(driver, lambda text: all(t in text for t in texts), repr(texts), timeout_s)


def _without_digits(text: str) -> str:
    """Clocks ("Loaded 12 seconds ago", refresh countdowns) tick forever; only their digits change."""
    return re.sub(r"\d+", "#", text)


def settle(driver, quiet_s: float = 1.0, timeout_s: float = 4) -> None:
    """Before a screenshot, wait until the page text stops changing for `quiet_s` (lazy parts drawn), at most
    `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    last, since = _without_digits(page_text(driver)), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.3)
        now = _without_digits(page_text(driver))
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return


def screenshot(driver, directory: Path, name: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.png"
    driver.save_screenshot(str(path))
    return path
