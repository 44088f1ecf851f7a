"""The console: through Django's test client, and in Debian's Chromium at 1280 px."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

import ctrlrun

from .base import PASSWORD, REPO



# --------------------------------------------------------------------------- the console through Django's test client


#: An amount in the approve band of REFUND_POLICY (above 50000, at most 1000000).
APPROVED_AMOUNT = 60000


def ask(refund, payment_id: str = "txn_1", amount: int = APPROVED_AMOUNT, user: str | None = None) -> str:
    """An agent's call in the approve band: returns the id of the pending request it leaves."""
    with ctrlrun.context(agent="support-agent", user=user):
        with pytest.raises(ctrlrun.ApprovalRequired) as caught:
            refund(payment_id=payment_id, amount=amount)
    return caught.value.request_id


def pay(refund, payment_id: str, amount: int = 100) -> None:
    """An allowed call that commits and writes a receipt."""
    with ctrlrun.context(agent="support-agent"):
        refund(payment_id=payment_id, amount=amount)


def url(name: str, *args: str) -> str:
    from django.urls import reverse

    return reverse(f"admin:{name}", args=args)


def approval_url(approval_id: str, answer: str | None = None) -> str:
    """The approval's page (or its confirmation page), with the pk quoted as the admin's own links quote it."""
    from django.contrib.admin.utils import quote

    if answer:
        return url("ctrlrun_approval_decide", quote(approval_id), answer)
    return url("ctrlrun_approval_change", quote(approval_id))


def receipt_url(receipt_id: str) -> str:
    from django.contrib.admin.utils import quote

    return url("ctrlrun_receipt_change", quote(receipt_id))


def text(response) -> str:
    import html

    return html.unescape(response.content.decode())


def shown_messages(response) -> list[str]:
    return [str(m) for m in response.context["messages"]]


def has_id(response, element_id: str) -> bool:
    return f'id="{element_id}"' in response.content.decode()


def login_redirect(response, path: str) -> bool:
    """A redirect to the admin's login page that comes back to ``path``."""
    from urllib.parse import parse_qs, urlsplit

    from django.urls import reverse

    if response.status_code != 302:
        return False
    location = urlsplit(response["Location"])
    return location.path == reverse("admin:login") and parse_qs(location.query)["next"] == [path]


def status(approval_id: str) -> str:
    from ctrlrun.models import Approval

    return Approval.objects.get(pk=approval_id).status


# --------------------------------------------------------------------------- the console in a browser (tests/e2e)


def tile(console, kind: str):
    """One of the overview's tiles on the index page, by what it links to."""
    from selenium.webdriver.common.by import By

    return console.driver.find_element(By.CSS_SELECTOR, f'#ctrlrun-overview a.tile[href*="{kind}"]')


def row_link(console, pk: str):
    """The link of a change list row, found by the object's (quoted) primary key."""
    from django.contrib.admin.utils import quote
    from selenium.webdriver.common.by import By

    return console.driver.find_element(By.CSS_SELECTOR, f'#result_list a[href*="/{quote(pk)}/change/"]')


def shown_json(console) -> dict:
    from selenium.webdriver.common.by import By

    return json.loads(console.driver.find_element(By.CSS_SELECTOR, "pre.ctrlrun-json").text)


def clean_env() -> dict[str, str]:
    """This process's environment without ctrlrun's or Django's settings: a console script started with
    it finds its configuration as a user's would (its folder, its own environment)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("CTRLRUN_") and k not in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL", "SECRET_KEY")}
    env["PYTHONPATH"] = str(REPO)
    return env


# --------------------------------------------------------------------------- the console's browser (tests/e2e)

#: The browser window the console's browser tests photograph at: a laptop's.
WIDTH, HEIGHT = 1280, 800


def screenshot_folder() -> Path:
    folder = Path(os.environ.get("CTRLRUN_TEST_OUTPUT") or REPO / "test-output") / "screenshots"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _gone(page, stale, driver) -> bool:
    """Whether the old page has left. Mid-navigation chromedriver may answer a question about its
    root with "Node with given id does not belong to the document" instead of a stale reference:
    that, too, says the page is gone."""
    from selenium.common.exceptions import WebDriverException

    try:
        return stale(driver)
    except WebDriverException as exc:
        if "does not belong to the document" in str(exc):
            return True
        raise


class Console:
    """One browser on the live console: opens pages, clicks, and photographs every page it visits."""

    def __init__(self, driver, base_url: str, test_name: str) -> None:
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

    def click(self, element) -> None:
        """Click something that loads a new page, and wait until the new page is there."""
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support import expected_conditions
        from selenium.webdriver.support.ui import WebDriverWait

        page = self.driver.find_element(By.TAG_NAME, "html")
        element.click()
        WebDriverWait(self.driver, 20).until(lambda d: _gone(page, expected_conditions.staleness_of(page), d))
        WebDriverWait(self.driver, 20).until(
            lambda d: d.execute_script("return document.readyState") == "complete")

    def login(self, username: str, password: str = PASSWORD) -> None:
        """Log in through the admin's login form, as a person would."""
        from selenium.webdriver.common.by import By

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

    def by_id(self, element_id: str):
        from selenium.webdriver.common.by import By

        return self.driver.find_element(By.ID, element_id)

    def has(self, element_id: str) -> bool:
        from selenium.common.exceptions import NoSuchElementException
        from selenium.webdriver.common.by import By

        try:
            self.driver.find_element(By.ID, element_id)
        except NoSuchElementException:
            return False
        return True

    def link(self, text: str):
        from selenium.webdriver.common.by import By

        return self.driver.find_element(By.LINK_TEXT, text)

    def request_link(self, approval_id: str):
        """The inbox shows a request's id shortened, with the whole id as its title."""
        from selenium.webdriver.common.by import By

        return self.driver.find_element(By.CSS_SELECTOR, f'a > span[title="{approval_id}"]')

    def text(self) -> str:
        from selenium.webdriver.common.by import By

        return self.driver.find_element(By.TAG_NAME, "body").text

    def messages(self) -> list[str]:
        from selenium.webdriver.common.by import By

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
