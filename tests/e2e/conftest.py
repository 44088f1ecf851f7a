"""A real headless Chromium (Debian's, through its ChromeDriver) driving the console on
pytest-django's live server, with a screenshot of every page the test visits.

``chromium`` and ``chromedriver`` are found on PATH (Debian's packages ``chromium`` and
``chromium-driver``). Without them each browser test is skipped with one line saying what to
install, and fails instead when ``CI`` is set (``.ci/run`` installs them and sets it).

Screenshots go to ``$CTRLRUN_TEST_OUTPUT/screenshots/<test>-<page>.png`` (default
``test-output/`` under the repository root), so a reviewer can look at the pages afterwards. The
``Console`` itself is in ``tests/support/``, for a test that drives another server.
"""
from __future__ import annotations

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

from tests.support import HEIGHT, WIDTH, Console, require_browser


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
