"""Identity providers (``Control(identity=...)``): the resolution table, principal expiry, the
receipt's ``principal`` block, and the header attacks; sync and async drivers alike.

Real policy files, the real store; the providers are the shipped ones or small honest classes.
"""
from __future__ import annotations

import asyncio
import datetime as dt
import logging

import pytest

import ctrlrun
from ctrlrun import Control, HeaderIdentityProvider, IdentityContext, IdentityError, Principal, StaticIdentityProvider
from ctrlrun.testing import Clock
from ctrlrun.policy import parse_policy
from tests.support import CHILD, events, policy_text, receipts

pytestmark = pytest.mark.usefixtures("store_db")

OPEN = """\
schema: ctrlrun.policy/v2
actions:
  tickets.close:
    effect: "close:{ticket}"
    decision: allow
"""

GRANTED = """\
schema: ctrlrun.policy/v7
authority:
  grants:
    - id: closer
      subject: {agent: "ctx-agent"}
      actions: ["tickets.*"]
actions:
  tickets.close:
    effect: "close:{ticket}"
    decision: allow
environment: production
"""


class Declining:
    def __init__(self) -> None:
        self.seen: list[IdentityContext] = []

    def resolve(self, context: IdentityContext) -> Principal | None:
        self.seen.append(context)
        return None


class Broken:
    def resolve(self, context: IdentityContext) -> Principal | None:
        raise KeyError("the directory is down")


class Refusing:
    def resolve(self, context: IdentityContext) -> Principal | None:
        raise IdentityError("credential rejected")


def _control(tmp_path, provider, text=OPEN, **options):
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    return Control.from_file(path, identity=provider, **options)


def _closer(control):
    ran = []

    @ctrlrun.protect("tickets.close", control=control)
    def close(ticket: str) -> str:
        ran.append(ticket)
        return f"closed {ticket}"

    return close, ran


def test_no_provider_keeps_context_and_no_principal(tmp_path):
    control = _control(tmp_path, None)
    close, ran = _closer(control)
    with pytest.raises(ctrlrun.ActionDenied) as denied:
        close(ticket="t1")
    assert denied.value.reason == "no_principal" and ran == [] and receipts() == []
    with ctrlrun.context(agent="ctx-agent"):
        close(ticket="t2")
    assert receipts()[-1]["principal"] == {"agent": "ctx-agent", "user": None, "claims": {}, "issuer": None,
                                           "expires_at": None}


def test_an_answering_provider_wins_with_one_warning_per_control(tmp_path, caplog):
    expiry = dt.datetime(2031, 1, 1, tzinfo=dt.timezone.utc)
    with caplog.at_level(logging.WARNING, logger="ctrlrun.identity"):
        provider = StaticIdentityProvider("bot-7", user="dana", claims={"tenant": "t1", "seats": 3},
                                          issuer="https://idp.example", expires_at=expiry)
    assert sum("StaticIdentityProvider" in r.getMessage() for r in caplog.records) == 1
    control = _control(tmp_path, provider)
    close, ran = _closer(control)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="ctrlrun"), ctrlrun.context(agent="ctx-agent"):
        close(ticket="t1")
        close(ticket="t2")
    differ = [r for r in caplog.records if "identity provider says" in r.getMessage()]
    assert len(differ) == 1
    close(ticket="t3")  # no context at all: the provider alone is enough
    assert ran == ["t1", "t2", "t3"]
    doc = receipts()[-1]
    assert doc["principal"] == {"agent": "bot-7", "user": "dana", "claims": {"tenant": "t1", "seats": 3},
                                "issuer": "https://idp.example", "expires_at": "2031-01-01T00:00:00.000Z"}


def test_claims_do_not_change_the_action_hash():
    """The action hash covers agent and user only: a verified call hashes as the asserted one did."""
    plain = ctrlrun.Action("stripe.refund", {"payment_id": "txn_2", "amount": 500000}, Principal("support-agent"))
    assert plain.hash == "sha256:22ec1c398e4b93d080b6cba61e5e11b0e21879552ac5dbf63c192d2b2e6af752"
    verified = ctrlrun.Action("stripe.refund", {"payment_id": "txn_2", "amount": 500000},
                              Principal("support-agent", claims={"tenant": "t1"}, issuer="https://idp",
                                        expires_at=dt.datetime(2031, 1, 1, tzinfo=dt.timezone.utc)))
    assert verified.hash == plain.hash


def test_a_declining_provider_falls_back_to_context_and_sees_it(tmp_path):
    provider = Declining()
    control = _control(tmp_path, provider)
    close, ran = _closer(control)
    with ctrlrun.context(agent="ctx-agent", user="u1"):
        close(ticket="t1")
    assert provider.seen[-1] == IdentityContext(action="tickets.close", environment="production",
                                                agent="ctx-agent", user="u1")
    assert dict(provider.seen[-1].headers) == {}
    with pytest.raises(ctrlrun.ActionDenied) as denied:
        close(ticket="t2")
    assert denied.value.reason == "no_principal" and ran == ["t1"]


def test_a_declining_provider_under_authority_is_no_principal(tmp_path):
    """With grants loaded, an identity only context() asserted is not enough: refused no_principal,
    nothing recorded."""
    control = _control(tmp_path, Declining(), GRANTED)
    close, ran = _closer(control)
    with ctrlrun.context(agent="ctx-agent"), pytest.raises(ctrlrun.ActionDenied) as denied:
        close(ticket="t1")
    assert denied.value.reason == "no_principal" and ran == [] and receipts() == []
    # The same call without a provider passes its grant: the refusal is the provider's decline.
    plain = _control(tmp_path, None, GRANTED)
    close, ran = _closer(plain)
    with ctrlrun.context(agent="ctx-agent"):
        close(ticket="t1")
    assert ran == ["t1"]


def test_a_raising_provider_is_identity_error_never_backfilled(tmp_path):
    control = _control(tmp_path, Broken())
    close, ran = _closer(control)
    with ctrlrun.context(agent="ctx-agent"), pytest.raises(IdentityError) as refused:
        close(ticket="t1")
    assert isinstance(refused.value.__cause__, KeyError) and ran == [] and receipts() == []
    control = _control(tmp_path, Refusing())
    close, ran = _closer(control)
    with ctrlrun.context(agent="ctx-agent"), pytest.raises(IdentityError, match="^credential rejected$"):
        close(ticket="t1")
    assert ran == []


def test_an_expired_principal_is_denied_with_a_receipt(tmp_path):
    clock = Clock()
    provider = StaticIdentityProvider("bot-7", expires_at=clock.now - dt.timedelta(seconds=1))
    control = _control(tmp_path, provider, clock=clock)
    close, ran = _closer(control)
    with pytest.raises(IdentityError, match="principal_expired"):
        close(ticket="t1")
    assert ran == []
    doc = receipts()[-1]
    assert (doc["result"], doc["decision"], doc["decision_reason"]) == ("denied", "deny", "principal_expired")
    assert events(doc["action_id"]) == ["ACTION_PROPOSED", "ACTION_DENIED"]
    from ctrlrun.models import Event

    assert Event.objects.get(action_id=doc["action_id"], type="ACTION_DENIED").data == {"reason": "principal_expired"}


def test_expiry_is_the_store_clock_not_the_host(tmp_path):
    clock = Clock()
    provider = StaticIdentityProvider("bot-7", expires_at=clock.now + dt.timedelta(minutes=5))
    control = _control(tmp_path, provider, clock=clock)
    close, ran = _closer(control)
    close(ticket="t1")
    clock.advance(minutes=5)  # exactly at expiry: expired
    with pytest.raises(IdentityError):
        close(ticket="t2")
    assert ran == ["t1"]


def test_async_driver_runs_the_same_resolution(tmp_path):
    clock = Clock()
    control = _control(tmp_path, StaticIdentityProvider("bot-a", claims={"k": "v"}), clock=clock)

    @ctrlrun.protect("tickets.close", control=control)
    async def close(ticket: str) -> str:
        return ticket

    assert asyncio.run(close(ticket="a1")) == "a1"
    assert receipts()[-1]["principal"]["claims"] == {"k": "v"}
    expired = _control(tmp_path, StaticIdentityProvider("bot-a", expires_at=clock.now), clock=clock)

    @ctrlrun.protect("tickets.close", control=expired)
    async def close_late(ticket: str) -> str:
        return ticket

    with pytest.raises(IdentityError):
        asyncio.run(close_late(ticket="a2"))
    assert receipts()[-1]["decision_reason"] == "principal_expired"
    broken = _control(tmp_path, Broken())
    with pytest.raises(IdentityError) as refused:
        asyncio.run(broken.acall("tickets.close", {"ticket": "a3"}, lambda: None))
    assert isinstance(refused.value.__cause__, KeyError)


def test_control_call_principal_is_what_a_provider_overrides(tmp_path):
    control = _control(tmp_path, StaticIdentityProvider("bot-7"))
    control.call("tickets.close", {"ticket": "c1"}, lambda: "ok", principal="asserted-agent")
    assert receipts()[-1]["principal"]["agent"] == "bot-7"


def test_header_provider_reads_only_its_headers():
    provider = HeaderIdentityProvider("X-Agent", user_header="X-User", issuer="proxy")
    ask = IdentityContext(action="a", environment="production", headers={"X-AGENT": " bot-1 ", "x-user": "dana"})
    assert provider.resolve(ask) == Principal("bot-1", "dana", issuer="proxy")
    assert provider.resolve(IdentityContext(action="a", environment="production", headers={"x-agent": "  "})) is None
    assert IdentityContext(action="a", environment="production", headers={"A": "1"}).header("a") == "1"


@pytest.mark.parametrize("value", ["bot\u202eevil", "bot\x00", "bot\r\nx-user: root", "bot\u200b", "b" * 9000])
def test_header_values_with_controls_bidi_or_huge_are_rejected(value, caplog):
    provider = HeaderIdentityProvider("x-agent", user_header="x-user")
    with caplog.at_level(logging.WARNING, logger="ctrlrun.identity"):
        assert IdentityContext(action="a", environment="production", headers={"x-agent": value}).header("x-agent") \
            is None
        for headers in ({"x-agent": value}, {"x-agent": "bot-1", "x-user": value}):
            with pytest.raises(IdentityError, match="^credential rejected$"):
                provider.resolve(IdentityContext(action="a", environment="production", headers=headers))
    assert any("ignored" in r.getMessage() for r in caplog.records)


def test_a_spoofed_header_is_ignored_without_a_header_provider(tmp_path):
    """A client sending x-agent: admin gets nothing when no header provider is configured: the
    provider in force (a declining one here) never reads it, and context() acts."""
    class FromContextOnly:
        def resolve(self, context):
            return None

    spoofed = {"X-Agent": "admin", "X-User": "root"}
    for n, provider in enumerate((FromContextOnly(), None)):
        control = _control(tmp_path, provider)
        with ctrlrun.context(agent="ctx-agent"):
            control.call("tickets.close", {"ticket": f"s1-{n}"}, lambda: "ok", headers=spoofed)
        assert (receipts()[-1]["principal"]["agent"], receipts()[-1]["principal"]["user"]) == ("ctx-agent", None)
        with pytest.raises(ctrlrun.ActionDenied) as denied:  # and without context(), the headers name nobody
            control.call("tickets.close", {"ticket": "s2"}, lambda: "ok", headers=spoofed)
        assert denied.value.reason == "no_principal"
    with pytest.raises(ctrlrun.InvalidArgument, match="headers must be a mapping"):
        control.call("tickets.close", {"ticket": "s3"}, lambda: "ok", headers={"x-agent": 1})


def test_bad_wiring_is_a_clear_error(tmp_path):
    with pytest.raises(ctrlrun.InvalidArgument, match="not an identity provider"):
        _control(tmp_path, object())
    with pytest.raises(ctrlrun.InvalidArgument, match="timezone-aware"):
        StaticIdentityProvider("a", expires_at=dt.datetime(2030, 1, 1))
    with pytest.raises(ctrlrun.InvalidArgument, match="float"):
        Principal("a", claims={"x": 1.5})
    with pytest.raises(ctrlrun.InvalidArgument, match="name a header"):
        HeaderIdentityProvider("  ")

    class Wrong:
        def resolve(self, context):
            return "bot-7"

    control = _control(tmp_path, Wrong())
    with pytest.raises(IdentityError, match="not a ctrlrun.Principal"):
        control.call("tickets.close", {"ticket": "w1"}, lambda: "ok")


def test_an_expired_principal_cannot_delegate():
    """Rule 0 of delegation: a principal whose credential has expired hands nothing down."""
    clock = Clock()
    control = Control(policy=parse_policy(policy_text("delegation")), clock=clock)
    late = Principal("orchestrator", expires_at=clock.now - dt.timedelta(seconds=1))
    with pytest.raises(IdentityError, match="principal_expired"):
        control.delegate("support", CHILD, by=late)
    from ctrlrun.models import Delegation

    assert not Delegation.objects.exists()
    made = control.delegate("support", CHILD, by=Principal("orchestrator", expires_at=clock.now + dt.timedelta(1)))
    assert made.id.startswith("dlg_")


def test_a_sweepers_receipt_keeps_the_verified_principal():
    """A running attempt's call is kept on its record (the stash) for a sweeper that writes the receipt
    of a worker that never came back: the principal's claims, issuer and expiry travel with it."""
    from ctrlrun.states import Decision
    from ctrlrun.store.chain import stash, unstash
    from ctrlrun.values import Call

    principal = Principal("bot-7", "dana", claims={"tenant": "t1"}, issuer="https://idp",
                          expires_at=dt.datetime(2031, 1, 1, 12, 30, 5, 123000, tzinfo=dt.timezone.utc))
    call = Call(ctrlrun.Action("tickets.close", {"ticket": "t"}, principal), Decision.ALLOW, "decision", None, "close:t")
    kept, _, _ = unstash(stash(call, 1, []).text)
    assert kept.action.principal == principal and kept.action.hash == call.action.hash
    plain = Call(ctrlrun.Action("tickets.close", {"ticket": "t"}, Principal("bot-7")), Decision.ALLOW, "decision",
                 None, "close:t")
    assert "credential" not in stash(plain, 1, []).text  # a principal without one stashes as before


def test_an_async_provider_is_awaited_by_both_drivers(tmp_path):
    class Remote:
        async def resolve(self, context):
            await asyncio.sleep(0)
            return Principal("async-bot", claims={"via": context.action})

    control = _control(tmp_path, Remote())
    control.call("tickets.close", {"ticket": "as1"}, lambda: "ok")

    async def go():
        return await control.acall("tickets.close", {"ticket": "as2"}, lambda: "ok")

    asyncio.run(go())
    assert [r["principal"]["agent"] for r in receipts()] == ["async-bot", "async-bot"]
    assert receipts()[-1]["principal"]["claims"] == {"via": "tickets.close"}
