"""``IdentityMiddleware`` + ``DjangoRequestIdentityProvider``: real views behind the real middleware
stack, through Django's test ``Client`` (WSGI, sync middleware) and ``AsyncClient`` (ASGI, the
async path); the agent from an API key or a service account, the user from ``request.user``.
"""
from __future__ import annotations

import asyncio

import pytest
from django.contrib.auth.models import Group
from django.test import AsyncClient, Client, override_settings

from ctrlrun.middleware import key_digest
from tests.support import identity_site, make_user, receipts

pytestmark = pytest.mark.usefixtures("store_db")

KEY = "ck_live_3f9a0d7c6b5e4a3b2c1d"


@pytest.fixture(autouse=True)
def site(settings):
    settings.ROOT_URLCONF = "tests.support.identity_site"
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, "ctrlrun.middleware.IdentityMiddleware"]
    settings.CTRLRUN_AGENT_API_KEYS = {key_digest(KEY): "billing-bot"}
    identity_site._control = None  # a Control per test, on this test's store
    yield settings


@pytest.mark.parametrize("path", ["/sync/", "/async/"])
def test_an_api_key_names_the_agent(path):
    answer = Client().get(path, headers={"X-Ctrlrun-Agent-Key": KEY})
    assert answer.status_code == 200, answer.content
    assert answer.json()["principal"] == {"agent": "billing-bot", "user": None, "claims": {"authenticated_by": "api-key"},
                                          "issuer": "django", "expires_at": None}


def test_async_client_with_a_logged_in_person_and_a_key():
    person = make_user("outsider", "dana")

    async def go():
        client = AsyncClient()
        await client.aforce_login(person)
        return await client.get("/async/", headers={"X-Ctrlrun-Agent-Key": KEY})

    answer = asyncio.run(go())
    assert answer.status_code == 200, answer.content
    assert (answer.json()["principal"]["agent"], answer.json()["principal"]["user"]) == ("billing-bot", "dana")


@pytest.mark.parametrize("path", ["/sync/", "/async/"])
def test_a_service_account_is_the_agent(path):
    account = make_user("outsider", "svc-triage")
    account.groups.add(Group.objects.create(name="ctrlrun-agents"))
    client = Client()
    client.force_login(account)
    answer = client.get(path)
    assert answer.status_code == 200, answer.content
    assert answer.json()["principal"]["agent"] == "svc-triage"
    assert answer.json()["principal"]["claims"] == {"authenticated_by": "service-account"}


def test_a_person_acts_through_the_site_agent(site):
    site.CTRLRUN_REQUEST_AGENT = "site-assistant"
    client = Client()
    client.force_login(make_user("outsider", "erin"))
    principal = client.get("/sync/").json()["principal"]
    assert (principal["agent"], principal["user"]) == ("site-assistant", "erin")


@pytest.mark.parametrize("path", ["/sync/", "/async/"])
def test_an_unknown_key_is_credential_rejected_and_never_backfilled(path, caplog):
    answer = Client().get(path, headers={"X-Ctrlrun-Agent-Key": "ck_guess"})
    assert answer.status_code == 403
    assert answer.json() == {"error": "IdentityError", "message": "credential rejected"}
    assert receipts() == []
    assert any("rejected" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("value", ["ck\u202elive", "x" * 9000, " "])
def test_hostile_key_headers_are_rejected(value):
    answer = Client().get("/sync/", headers={"X-Ctrlrun-Agent-Key": value})
    assert answer.status_code == 403 and answer.json()["message"] == "credential rejected"


def test_anonymous_without_a_key_declines_to_no_principal():
    answer = Client().get("/sync/")
    assert answer.status_code == 403 and answer.json()["error"] == "ActionDenied"
    assert "no principal" in answer.json()["message"] and receipts() == []


def test_a_spoofed_agent_header_means_nothing():
    """A client naming itself in x-agent or x-ctrlrun-agent gets no identity: only a listed key does."""
    answer = Client().get("/sync/", headers={"X-Agent": "billing-bot", "X-Ctrlrun-Agent": "billing-bot"})
    assert answer.status_code == 403 and answer.json()["error"] == "ActionDenied"


def test_a_key_listed_in_clear_is_refused_with_what_to_do(site):
    site.CTRLRUN_AGENT_API_KEYS = {KEY: "billing-bot"}
    with pytest.raises(Exception, match="sha256"):
        Client().get("/sync/", headers={"X-Ctrlrun-Agent-Key": KEY})


def test_the_default_control_reads_the_provider_setting(site):
    from ctrlrun.control import default_control, reset_default
    from ctrlrun.middleware import DjangoRequestIdentityProvider

    site.CTRLRUN_IDENTITY_PROVIDER = "ctrlrun.middleware.DjangoRequestIdentityProvider"
    reset_default()
    try:
        assert isinstance(default_control().identity, DjangoRequestIdentityProvider)
        site.CTRLRUN_IDENTITY_PROVIDER = "ctrlrun.nowhere.Provider"
        reset_default()
        with pytest.raises(Exception, match="cannot be imported"):
            default_control().identity  # noqa: B018
    finally:
        reset_default()


def test_outside_a_request_the_provider_declines():
    from ctrlrun import IdentityContext
    from ctrlrun.middleware import DjangoRequestIdentityProvider, request_identity

    assert request_identity() is None
    assert DjangoRequestIdentityProvider().resolve(IdentityContext(action="a", environment="production")) is None


def test_manage_py_check_names_bad_identity_settings(site):
    from ctrlrun.checks import check_identity

    assert check_identity() == []
    site.CTRLRUN_AGENT_API_KEYS = {"my-plain-key": "billing-bot"}
    site.CTRLRUN_IDENTITY_PROVIDER = "ctrlrun.nowhere.Provider"
    found = check_identity()
    assert [message.id for message in found] == ["ctrlrun.E007", "ctrlrun.E007"]
    assert "cannot be imported" in found[0].msg and "never list a key itself" in found[1].msg
