"""Paused agent runs in a real headless Chromium at 1280 px: the list, a run's page with its
collapsed state, and the approval it waits on, linked both ways. Photographed for the reviewer."""
from __future__ import annotations

import pytest
from django.contrib.admin.utils import quote
from selenium.webdriver.common.by import By

from ctrlrun import resumption, store
from ctrlrun.models import PausedRun
from tests.support import make_user, pause, rewrite_paused

pytestmark = pytest.mark.usefixtures("store_db", "console_groups", "files")


def test_an_auditor_reads_paused_runs_and_follows_them_to_their_approvals(console):
    waiting = pause("pydantic-ai", {"payment_id": "txn_wait", "amount": 500_000})
    done = pause("pydantic-ai", {"payment_id": "txn_done", "amount": 500_000})
    broken = pause("pydantic-ai", {"payment_id": "txn_broken", "amount": 500_000})
    store.answer_approval(done, True, by="alice")
    store.answer_approval(broken, False, by="bob")
    rewrite_paused(broken, resume_with="nobody-knows-me")
    resumption.resume_request(done)
    row = PausedRun.objects.get(approval_id=broken)
    assert store.claim_paused_run(row.pk, "denied", "worker-3:777")
    store.finish_paused_run(row.pk, error="RuntimeError: the agent's model is down")
    make_user("auditor", "otto")

    console.login("otto")
    console.click(console.link("Paused runs"))
    assert console.path() == "/admin/ctrlrun/pausedrun/"
    body = console.text()
    for expected in ("pending", "resumed", "failed", "pydantic-ai", "nobody-knows-me", "worker-3:777", waiting[:16]):
        assert expected in body, expected
    assert console.driver.find_element(By.CSS_SELECTOR, f'#result_list a[title="{waiting}"]')
    console.shot("paused-run-list")
    assert console.driver.execute_script("""
        const table = document.getElementById('result_list'), box = table.parentElement;
        return document.documentElement.scrollWidth <= document.documentElement.clientWidth
            && box.scrollWidth <= box.clientWidth;""")  # fits 1280 px: no scrollbar, not even the table's

    console.click(console.driver.find_element(By.LINK_TEXT, str(row.pk)))
    assert "RuntimeError: the agent's model is down" in console.text()
    state = console.by_id("ctrlrun-paused-state")
    assert state.get_attribute("open") is None  # collapsed
    assert "characters of JSON text" in state.text
    console.shot("paused-run-detail")
    state.find_element(By.TAG_NAME, "summary").click()
    assert state.get_attribute("open") is not None and "txn_broken" in state.text
    console.shot("paused-run-detail-state-open")
    assert not console.driver.find_elements(By.CSS_SELECTOR, "input[type=submit], textarea")  # read-only

    console.click(console.driver.find_element(By.CSS_SELECTOR, f'a[title="{broken}"]'))
    line = console.by_id("ctrlrun-paused-run")
    assert "A paused pydantic-ai run waited for this answer" in line.text
    console.shot("approval-with-paused-run")
    console.click(line.find_element(By.TAG_NAME, "a"))
    assert console.path() == f"/admin/ctrlrun/pausedrun/{row.pk}/change/"

    console.open(f"/admin/ctrlrun/approval/{quote(waiting)}/change/")  # as the console quotes it (apr_25… is apr%…)
    assert "A paused pydantic-ai run waits for this answer" in console.by_id("ctrlrun-paused-run").text
    console.shot("approval-waiting-with-paused-run")
