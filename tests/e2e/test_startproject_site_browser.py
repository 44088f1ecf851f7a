"""The console in a fresh ``django-admin startproject`` site, at 1280 px in a real headless Chromium
(issue 25, item 7): the app brings its own look to any project. The site is made from the README's
recipe as written (tests/support/ StartprojectSite parses it), migrated, given a superuser and a
few protected calls (one committed, one waiting for approval, one observed under ``mode: observe``),
then served by ``runserver`` (DEBUG on, as a developer first runs it). Nothing of this repository's
``templates/`` is in that project: every style, the banner and the header come from ctrlrun.

On each ctrlrun page: the console's stylesheet is loaded (a state badge is coloured), the header
names ctrlrun, the observe-mode banner is there (styled); the Events list fits 1280 px with its data
column in view. Every page is photographed (tests/e2e/conftest.py says where)."""
from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from selenium.webdriver.common.by import By

from tests.support import PASSWORD, Console, StartprojectSite, policy_text

pytestmark = pytest.mark.slow

ENFORCE = policy_text("refund").replace("schema: ctrlrun.policy/v2", "schema: ctrlrun.policy/v3")
OBSERVE = ENFORCE.replace("schema: ctrlrun.policy/v3", "schema: ctrlrun.policy/v3\nmode: observe")

CALLS = f"""
import ctrlrun
from django.contrib.auth import get_user_model

get_user_model().objects.create_superuser("root", "root@example.com", {PASSWORD!r})


@ctrlrun.protect("stripe.refund", effect="refund:{{payment_id}}")
def refund(payment_id, amount):
    return {{"id": "re_" + payment_id, "amount": amount}}


with ctrlrun.context(agent="support-agent"):
    refund(payment_id="txn_1", amount=100)                      # allowed: committed
    try:
        refund(payment_id="txn_2", amount=60000)                # approve band: a pending request
    except ctrlrun.ApprovalRequired as exc:
        print("pending", exc.request_id)
"""
OBSERVED = """
import ctrlrun


@ctrlrun.protect("stripe.refund", effect="refund:{payment_id}")
def refund(payment_id, amount):
    return {"id": "re_" + payment_id, "amount": amount}


with ctrlrun.context(agent="support-agent"):
    refund(payment_id="txn_3", amount=2000000)                  # would be denied: observed, it runs
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(url: str, server: subprocess.Popen, seconds: float = 90) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except OSError:
            if time.monotonic() > deadline or server.poll() is not None:
                raise
            time.sleep(0.3)


@pytest.fixture
def site(tmp_path):
    site = StartprojectSite(tmp_path, policy=ENFORCE)
    migrated = site.manage("migrate")
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    made = site.shell(CALLS)
    assert made.returncode == 0 and "pending apr_" in made.stdout, made.stdout + made.stderr
    (tmp_path / "ctrlrun.yaml").write_text(OBSERVE)
    observed = site.shell(OBSERVED)
    assert observed.returncode == 0, observed.stdout + observed.stderr
    return site


@pytest.fixture
def served(site):
    port = free_port()
    server = subprocess.Popen([sys.executable, str(site.folder / "manage.py"), "runserver", "--noreload",
                               f"127.0.0.1:{port}"], cwd=site.folder, env=site.env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(f"http://127.0.0.1:{port}/admin/login/", server)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(timeout=30)


def stylesheets(console: Console) -> list[str]:
    return console.driver.execute_script(
        "return [...document.styleSheets].map(s => s.href || '').filter(h => h.includes('/ctrlrun/'))")


def colour(console: Console, css: str, prop: str = "background-color") -> str:
    element = console.driver.find_element(By.CSS_SELECTOR, css)
    return console.driver.execute_script(f"return getComputedStyle(arguments[0])['{prop}']", element)


def console_chrome(console: Console) -> None:
    """What every ctrlrun page brings itself: its stylesheet, a header naming ctrlrun, the banner."""
    assert any(h.endswith("/static/ctrlrun/console.css") for h in stylesheets(console)), stylesheets(console)
    header = console.driver.find_element(By.CSS_SELECTOR, "#site-name").text
    assert "ctrlrun" in header and "Django administration" not in header, header
    banner = console.by_id("ctrlrun-observe-banner")
    assert banner.is_displayed() and banner.text.startswith("OBSERVE MODE — nothing is enforced"), banner.text
    assert colour(console, "#ctrlrun-observe-banner") == "rgb(122, 31, 31)"  # styled, not plain text
    assert len(console.driver.find_elements(By.ID, "ctrlrun-observe-banner")) == 1


def fits(console: Console) -> bool:
    return console.driver.execute_script("return document.documentElement.scrollWidth") <= 1280


def test_the_console_brings_its_own_look_to_a_startproject_site(chromium, served, request):
    console = Console(chromium, served, request.node.name)
    console.login("root")
    console.shot("front-page")
    banner = console.by_id("ctrlrun-observe-banner")  # the overview brings it to the front page
    assert banner.is_displayed() and colour(console, "#ctrlrun-observe-banner") == "rgb(122, 31, 31)"
    assert console.has("ctrlrun-overview")
    header = console.driver.find_element(By.CSS_SELECTOR, "#site-name").text  # the README's index.html names it
    assert "ctrlrun" in header and "Django administration" not in header, header

    console.open("/admin/ctrlrun/")
    console.shot("app-index")
    console_chrome(console)

    console.open("/admin/ctrlrun/effectrecord/")
    console.shot("effects")
    console_chrome(console)
    assert colour(console, "#result_list .ctrlrun-badge.ok") == "rgb(46, 133, 64)"  # committed, green
    assert fits(console)

    console.open("/admin/ctrlrun/approval/")
    console.shot("approvals")
    console_chrome(console)
    assert colour(console, "#result_list .ctrlrun-badge.warn") == "rgb(154, 106, 0)"  # pending
    assert fits(console)
    console.click(console.driver.find_element(By.CSS_SELECTOR, "#result_list a[href*='/approval/apr_']"))
    console.shot("approval")
    console_chrome(console)
    assert "no effect record yet" in console.text()  # txn_2's record is made when the approved call runs

    console.open("/admin/ctrlrun/receipt/")
    console.shot("receipts")
    console_chrome(console)
    assert colour(console, "#result_list .ctrlrun-badge.info") == "rgb(47, 111, 173)"  # observed
    assert fits(console)

    console.open("/admin/ctrlrun/event/")
    console.shot("events")
    console_chrome(console)
    width = console.driver.execute_script("return document.documentElement.scrollWidth")
    assert width <= 1280, width
    data = console.driver.find_elements(By.CSS_SELECTOR, "#result_list td.field-short_data")
    assert data, "no data column on the Events list"
    right = console.driver.execute_script(
        "return Math.max(...arguments[0].map(td => td.getBoundingClientRect().right))", data)
    assert right <= 1280 and all(td.is_displayed() and td.size["width"] > 50 for td in data), right

    console.click(console.driver.find_element(By.CSS_SELECTOR, "#result_list td.field-call a"))
    console.shot("call")
    console_chrome(console)
    assert fits(console)
