"""Issue 25 item 14: what a newcomer reads first and where the console sends them. The README's map of
docs/ comes right after the quick start; docs/django.md names as "not built yet" only what this version
refuses by name (``policy.schema.NOT_BUILT``); the chain-check page points to docs/evidence.md, which is what
covers incremental checks, not to the README."""
from __future__ import annotations

import re

import pytest

from ctrlrun.policy.schema import NOT_BUILT
from tests.support import REPO, make_user

pytestmark = pytest.mark.usefixtures("store_db", "console_groups")


def sections(page: str) -> list[str]:
    return re.findall(r"^## (.+)$", (REPO / page).read_text(encoding="utf-8"), re.M)


def test_the_readme_map_follows_the_quick_start():
    names = sections("README.md")
    assert names.index("The map") == names.index("Quick start") + 1, names


def test_django_md_names_only_features_not_built():
    text = " ".join((REPO / "docs" / "django.md").read_text(encoding="utf-8").split())
    named = re.findall(r"not built yet \(([^)]*)\)", text)
    assert named, "docs/django.md no longer says which features are refused as not built"
    keys = re.findall(r"`([a-z_.]+)[:`]", " ".join(named))
    assert keys and all(key in NOT_BUILT or key == "ctrlrun.policy.change" for key in keys), keys
    assert "authority" not in keys


def verify_page(client) -> str:
    make_user("auditor", "otto")
    client.login(username="otto", password="console-pass-1")
    response = client.get("/admin/ctrlrun/receipt/verify/")
    assert response.status_code == 200
    return response.content.decode()


def test_the_chain_check_page_points_to_evidence_md(client, settings):
    page = verify_page(client)
    assert "see the README" not in page
    assert "docs/evidence.md" in page and "Recorded checks, full and incremental" in page
    settings.CTRLRUN_DOCS_URL = "https://docs.example.com/ctrlrun/"
    linked = client.get("/admin/ctrlrun/receipt/verify/").content.decode()
    assert 'href="https://docs.example.com/ctrlrun/evidence.md#recorded-checks-full-and-incremental"' in linked
    assert "## Recorded checks, full and incremental" in (REPO / "docs" / "evidence.md").read_text(encoding="utf-8")
