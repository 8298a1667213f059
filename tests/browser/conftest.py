"""A real headless Chromium on the admin, served by pytest-django's live server.

The runs are driven in the test process (an un-frozen ``durable_env``): what the admin's buttons
send is captured, and the test runs it with ``engine.run_until_idle()``. Skipped with the reason
when Chromium, its driver or Selenium is missing (a user machine); in CI (``.ci/run`` installs
them, ``DURABLE_REQUIRE_SERVICES=1``) a missing one fails the run.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from durable import dispatch
from durable.testing import DurableEnv
from tests.conftest import _skip_or_fail

#: Where each test's screenshots go, one PNG per page it looked at.
SCREENSHOTS = Path(os.environ.get("DURABLE_SCREENSHOTS") or Path(settings.BASE_DIR) / "var" / "screenshots")
CHROMIUM = ("chromium", "chromium-browser", "google-chrome")
WIDTH = 1600


def _missing() -> str | None:
    if importlib.util.find_spec("selenium") is None:
        return "selenium is not installed (pip install -r requirements.txt)"
    if not any(shutil.which(name) for name in CHROMIUM):
        return "no Chromium here: apt-get install chromium chromium-driver (CI installs them)"
    if not shutil.which("chromedriver"):
        return "no chromedriver here: apt-get install chromium-driver (CI installs it)"
    return None


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    """One headless Chromium for the session, with a profile of its own."""
    reason = _missing()
    if reason:
        _skip_or_fail(f"browser tests skipped: {reason}")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = next(shutil.which(name) for name in CHROMIUM if shutil.which(name))
    profile = tempfile.mkdtemp(prefix="durable-chromium-")
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        f"--user-data-dir={profile}",
        f"--window-size={WIDTH},1000",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(shutil.which("chromedriver")))
    driver.implicitly_wait(0)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def engine(transactional_db: Any) -> Iterator[DurableEnv]:
    """durable's messages captured in this process, on the real clock: the live server's views
    send, the test runs what they sent."""
    env = DurableEnv(freezer=None)
    lock = threading.Lock()
    capture = env.capture

    def send(message: dispatch.Message) -> None:
        with lock:  # the live server's thread sends while the test may read
            capture(message)

    env.transport = dispatch.Transport(send=send, served_queues=None, may_wait=False, keep_alive=False)
    with dispatch.using(env.transport):
        yield env


class Page:
    """The browser on the live server, with the few moves the tests make."""

    def __init__(self, driver: Any, base: str, name: str) -> None:
        self.driver, self.base, self.name = driver, base, name
        self.shots: list[Path] = []

    def open(self, path: str) -> Page:
        self.driver.get(self.base + path)
        return self

    def find(self, css: str) -> Any:
        from selenium.webdriver.common.by import By

        return self.driver.find_element(By.CSS_SELECTOR, css)

    def all(self, css: str) -> list[Any]:
        from selenium.webdriver.common.by import By

        return self.driver.find_elements(By.CSS_SELECTOR, css)

    def text(self, css: str = "body") -> str:
        return self.find(css).text

    def click(self, css: str) -> Page:
        """Click and wait for the page it loads."""
        from selenium.webdriver.support.ui import WebDriverWait

        old = self.find("html")
        self.find(css).click()
        WebDriverWait(self.driver, 20).until(lambda d: _stale(old))
        return self

    def run_and_wait(self, script: str, *args: Any) -> Page:
        """Run ``script`` in the page and wait for the page it loads."""
        from selenium.webdriver.support.ui import WebDriverWait

        old = self.find("html")
        self.driver.execute_script(script, *args)
        WebDriverWait(self.driver, 20).until(lambda d: _stale(old))
        return self

    def log_in(self, username: str, password: str) -> Page:
        self.driver.delete_all_cookies()
        self.open("/admin/login/?next=/admin/")
        self.find("#id_username").send_keys(username)
        self.find("#id_password").send_keys(password)
        self.click("input[type=submit]")
        # The admin's app list beside every page is folded away (it remembers), to give the
        # console's tables the width.
        self.driver.execute_script("localStorage.setItem('django.admin.navSidebarIsOpen', 'false')")
        return self

    def shot(self, label: str) -> Path:
        """A full-page screenshot, as a test artifact."""
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        height = self.driver.execute_script("return document.documentElement.scrollHeight")
        self.driver.set_window_size(WIDTH, min(max(int(height), 600), 4000))
        self.driver.execute_script("window.scrollTo(0, 0)")  # from the top, not from an #anchor
        path = SCREENSHOTS / f"{self.name}--{label}.png"
        self.driver.save_screenshot(str(path))
        self.driver.set_window_size(WIDTH, 1000)
        self.shots.append(path)
        return path


def _stale(element: Any) -> bool:
    from selenium.common.exceptions import StaleElementReferenceException, WebDriverException

    try:
        element.tag_name  # noqa: B018 - touching it tells whether the page was replaced
    except StaleElementReferenceException:
        return True
    except WebDriverException as exc:
        # Chromium answers so, instead of "stale", when it is asked in the middle of replacing
        # the page (seen once in CI under load): the element's document is gone all the same.
        if "does not belong to the document" in str(exc):
            return True
        raise
    return False


@pytest.fixture
def page(browser: Any, live_server: Any, request: pytest.FixtureRequest) -> Page:
    return Page(browser, live_server.url, request.node.name.removeprefix("test_"))
