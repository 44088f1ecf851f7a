"""A real headless Chromium (Debian's, through its ChromeDriver) driving the console on
pytest-django's live server, with a screenshot of every page the test visits.

``chromium`` and ``chromedriver`` are found on PATH (Debian's packages ``chromium`` and
``chromium-driver``). Without them each browser test is skipped with one line saying what to
install, and fails instead when ``CI`` is set (``.ci/run`` installs them and sets it).

Screenshots go to ``$CTRLRUN_TEST_OUTPUT/screenshots/<test>-<page>.png`` (default
``test-output/`` under the repository root), so a reviewer can look at the pages afterwards.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.common.exceptions import NoSuchElementException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import WebDriverWait

from tests.support import PASSWORD, REPO, require_browser

WIDTH, HEIGHT = 1280, 800  # a laptop


def screenshot_folder() -> Path:
    folder = Path(os.environ.get("CTRLRUN_TEST_OUTPUT") or REPO / "test-output") / "screenshots"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


class Console:
    """One browser on the live console: opens pages, clicks, and photographs every page it visits."""

    def __init__(self, driver: webdriver.Chrome, base_url: str, test_name: str) -> None:
        self.driver = driver
        self.base_url = base_url
        self.test_name = re.sub(r"[^\w.-]+", "_", test_name)
        self.folder = screenshot_folder()
        for old in self.folder.glob(f"{self.test_name}-*.png"):
            old.unlink()
        self.shots: list[Path] = []

    # -- navigation

    def open(self, path: str) -> None:
        self.driver.get(self.base_url + path)

    def click(self, element: WebElement) -> None:
        """Click something that loads a new page, and wait until the new page is there."""
        page = self.driver.find_element(By.TAG_NAME, "html")
        element.click()
        WebDriverWait(self.driver, 20).until(expected_conditions.staleness_of(page))
        WebDriverWait(self.driver, 20).until(
            lambda d: d.execute_script("return document.readyState") == "complete")

    def login(self, username: str, password: str = PASSWORD) -> None:
        """Log in through the admin's login form, as a person would."""
        self.open("/admin/login/?next=/admin/")
        self.shot("login")
        self.by_id("id_username").send_keys(username)
        self.by_id("id_password").send_keys(password)
        self.click(self.driver.find_element(By.CSS_SELECTOR, "#login-form input[type=submit]"))
        assert self.path() == "/admin/", self.path()
        welcome = self.driver.find_element(By.CSS_SELECTOR, "#user-tools strong").get_attribute("textContent")
        assert welcome == username  # the page shows it upper-cased by CSS

    # -- reading

    def path(self) -> str:
        return self.driver.current_url.removeprefix(self.base_url).split("?")[0]

    def by_id(self, element_id: str) -> WebElement:
        return self.driver.find_element(By.ID, element_id)

    def has(self, element_id: str) -> bool:
        try:
            self.driver.find_element(By.ID, element_id)
        except NoSuchElementException:
            return False
        return True

    def link(self, text: str) -> WebElement:
        return self.driver.find_element(By.LINK_TEXT, text)

    def request_link(self, approval_id: str) -> WebElement:
        """The inbox shows a request's id shortened, with the whole id as its title."""
        return self.driver.find_element(By.CSS_SELECTOR, f'a > span[title="{approval_id}"]')

    def text(self) -> str:
        return self.driver.find_element(By.TAG_NAME, "body").text

    def messages(self) -> list[str]:
        return [li.text for li in self.driver.find_elements(By.CSS_SELECTOR, "ul.messagelist li")]

    # -- evidence for the reviewer

    #: The window's width and height for screenshots (a subclass may photograph narrower).
    width, height = WIDTH, HEIGHT

    def shot(self, page: str) -> Path:
        """Save the whole page (the window grows to its height) as <test>-<page>.png."""
        height = self.driver.execute_script(
            "return Math.max(document.body.scrollHeight, document.documentElement.scrollHeight)")
        self.driver.set_window_size(self.width, min(max(self.height, height + 140), 6000))
        path = self.folder / f"{self.test_name}-{page}.png"
        try:
            assert self.driver.save_screenshot(str(path)), f"no screenshot saved for {page}"
        finally:
            self.driver.set_window_size(self.width, self.height)
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 2_000, path
        self.shots.append(path)
        return path


@pytest.fixture
def chromium():
    chromium_path, chromedriver_path = require_browser()
    options = webdriver.ChromeOptions()
    options.binary_location = chromium_path
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--no-first-run", "--disable-background-networking", "--disable-component-update",
                     "--disable-sync", f"--window-size={WIDTH},{HEIGHT}"):
        options.add_argument(argument)
    # An explicit driver path: Selenium Manager is never asked to find or download anything.
    driver = webdriver.Chrome(service=Service(executable_path=chromedriver_path), options=options)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


@pytest.fixture
def console(chromium, live_server, request):
    return Console(chromium, live_server.url, request.node.name)
