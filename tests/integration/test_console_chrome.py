"""What ctrlrun's own templates bring to every ctrlrun page (issue 25, item 7), in this repository's
project, whose base_site.html also names the console and shows the banner: the console's stylesheet
once, the header "ctrlrun console", and the observe-mode banner exactly once (never twice, though the
project's base_site and ctrlrun's templates both ask for it); pages of other apps keep the banner.
The startproject site, with none of this repository's templates, is
tests/e2e/test_startproject_site_browser.py.
Django's test client on a real database."""
from __future__ import annotations

import pytest
from django.urls import reverse

from tests.support import make_user

pytestmark = pytest.mark.usefixtures("store_db", "console_groups")

OBSERVE = """\
schema: ctrlrun.policy/v3
mode: observe
actions:
  stripe.refund:
    effect: "refund:{payment_id}"
    decision: allow
"""
CTRLRUN_PAGES = ["admin:app_list", "admin:ctrlrun_approval_changelist", "admin:ctrlrun_effectrecord_changelist",
                 "admin:ctrlrun_receipt_changelist", "admin:ctrlrun_event_changelist",
                 "admin:ctrlrun_policydocument_changelist", "admin:ctrlrun_pausedrun_changelist",
                 "admin:ctrlrun_delegation_changelist", "admin:ctrlrun_receipt_verify"]


def address(name: str) -> str:
    return reverse(name, kwargs={"app_label": "ctrlrun"}) if name == "admin:app_list" else reverse(name)


def test_each_ctrlrun_page_brings_its_stylesheet_header_and_one_banner(client, use_policy):
    use_policy(OBSERVE)
    client.force_login(make_user("superuser"))
    for name in CTRLRUN_PAGES:
        page = client.get(address(name))
        body = page.content.decode()
        assert page.status_code == 200, name
        assert body.count("ctrlrun/console.css") == 1, name
        assert body.count('id="ctrlrun-observe-banner"') == 1, name
        assert body.count("ctrlrun/observe.css") == 1, name
        assert '<div id="site-name"><a href="/admin/">ctrlrun console</a></div>' in body, name
        assert "| ctrlrun console</title>" in body, name
    for name in ("admin:index", "admin:auth_user_changelist"):  # the project's base_site: the banner, once
        body = client.get(reverse(name)).content.decode()
        assert body.count('id="ctrlrun-observe-banner"') == 1, name
        assert "ctrlrun console</a></div>" in body, name


def test_a_project_header_of_its_own_is_kept_beside_ctrlrun(client, use_policy, monkeypatch):
    from django.contrib import admin

    use_policy(OBSERVE)
    monkeypatch.setattr(admin.site, "site_header", "Acme operations")
    client.force_login(make_user("superuser"))
    body = client.get(reverse("admin:ctrlrun_event_changelist")).content.decode()
    assert '<a href="/admin/">Acme operations · ctrlrun console</a>' in body
