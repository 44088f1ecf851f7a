"""``ctrlrun mcp-operator`` (spec §E4, with §D4/§D5): a real process on loopback driven by the SDK's
client. Reads need no credential; approve, deny and resolve are answered by the verified person
of the request's credential (trusted headers, or a bearer JWT whose roles claim is matched byte for
byte), through the store's rules: the requester never approves their own request, the same person
twice counts once, each approver holds every pinned role."""
from __future__ import annotations

import json

import pytest

from ctrlrun import store
from ctrlrun.models import Event
from tests.support import ISSUER, TWO_OF_FINANCE_POLICY as TWO_OF_FINANCE, ask, make_ambiguous, sign
from tests.support.operator import operator_call, operator_tools, start_operator

pytestmark = pytest.mark.usefixtures("hook_registry", "store_db")

ONE_OF_FINANCE = TWO_OF_FINANCE.replace("    approvals_required: 2\n", "")
PLAIN = ONE_OF_FINANCE.replace("        controls: [four-eyes]\n", "")
SECRET = "operator-test-secret-of-at-least-32-bytes!"


def person(agent: str, user: str) -> dict[str, str]:
    return {"x-agent": agent, "x-user": user}


@pytest.fixture
def headers_operator(tmp_path):
    def start(policy: str):
        proc = start_operator(tmp_path, policy, "--principal-header", "x-agent", "--user-header", "x-user")
        started.append(proc)
        return proc
    started: list = []
    yield start
    for proc in started:
        proc.stop()


@pytest.fixture
def jwt_operator(tmp_path):
    started: list = []

    def start(policy: str):
        (tmp_path / "jwt.secret").write_text(SECRET)
        proc = start_operator(tmp_path, policy, "--identity-jwt", "--identity-jwt-secret-file",
                              str(tmp_path / "jwt.secret"), "--identity-jwt-issuer", ISSUER,
                              "--identity-jwt-audience", "ctrlrun-operator", "--identity-jwt-algorithm", "HS256",
                              "--identity-jwt-user-claim", "email", "--approver-roles-claim", "roles")
        started.append(proc)
        return proc
    yield start
    for proc in started:
        proc.stop()


def bearer(user: str, roles: list[str], *, agent: str = "assistant") -> dict[str, str]:
    import time

    claims = {"iss": ISSUER, "aud": "ctrlrun-operator", "sub": agent, "email": user, "roles": roles,
              "exp": int(time.time()) + 600}
    return {"authorization": f"Bearer {sign(claims, SECRET.encode(), alg='HS256', typ=None)}"}


def code(answer) -> tuple[int, str]:
    return answer.code, (answer.data or {}).get("error")


def test_the_tools_and_the_pending_list_without_a_credential(use_policy, refund, headers_operator):
    use_policy(PLAIN)
    request_id = ask(refund, user="rita")
    proc = headers_operator(PLAIN)
    assert operator_tools(proc.url) == ["list_pending_approvals", "inspect_action", "receipts", "effects", "stats",
                                        "approve", "deny", "resolve"]
    listed = operator_call(proc.url, "list_pending_approvals", {})
    assert [a["request_id"] for a in listed.structured_content["approvals"]] == [request_id]
    assert json.loads(listed.content[0].text) == listed.structured_content
    assert listed.structured_content["approvals"][0]["principal"] == {"agent": "support-agent", "user": "rita"}


def test_grant_and_deny_by_a_named_person(use_policy, refund, headers_operator):
    use_policy(PLAIN)
    first, second = ask(refund, user="rita"), ask(refund, payment_id="txn_2", user="rita")
    proc = headers_operator(PLAIN)
    granted = operator_call(proc.url, "approve", {"request_id": first}, person("console", "dana"))
    assert granted.structured_content["status"] == "granted"
    assert granted.structured_content["approver"] == "mcp-operator:dana"
    denied = operator_call(proc.url, "deny", {"request_id": second}, person("console", "dana"))
    assert (denied.structured_content["status"], store.get_approval(second).status) == ("denied", "denied")
    again = operator_call(proc.url, "approve", {"request_id": first}, person("console", "erin"))
    assert code(again) == (-41003, "ctrlrun.approval_denied") and again.data["reason"] == "already granted"


def test_an_unverified_caller_is_refused_and_changes_nothing(use_policy, refund, headers_operator):
    use_policy(PLAIN)
    request_id = ask(refund, user="rita")
    proc = headers_operator(PLAIN)
    assert code(operator_call(proc.url, "approve", {"request_id": request_id})) == (-41007, "ctrlrun.no_principal")
    agent_only = operator_call(proc.url, "approve", {"request_id": request_id}, {"x-agent": "console"})
    assert code(agent_only) == (-41013, "ctrlrun.not_a_human")  # an agent with no user: not a person
    assert store.get_approval(request_id).status == "pending"


def test_the_requester_cannot_approve_their_own_request(use_policy, refund, headers_operator):
    use_policy(PLAIN)
    request_id = ask(refund, user="rita")
    proc = headers_operator(PLAIN)
    own = operator_call(proc.url, "approve", {"request_id": request_id}, person("console", "rita"))
    assert code(own) == (-41003, "ctrlrun.approval_denied")
    assert store.get_approval(request_id).status == "pending"


def test_m_of_n_with_two_verified_people_and_the_same_person_twice(use_policy, refund, jwt_operator):
    use_policy(TWO_OF_FINANCE)
    request_id = ask(refund, user="rita")
    proc = jwt_operator(TWO_OF_FINANCE)
    first = operator_call(proc.url, "approve", {"request_id": request_id}, bearer("alice", ["finance"]))
    assert first.structured_content == {"request_id": request_id, "status": "pending", "approvals_required": 2,
                                        "approvals_recorded": 1}
    twice = operator_call(proc.url, "approve", {"request_id": request_id}, bearer("alice", ["finance"]))
    assert twice.structured_content["approvals_recorded"] == 1  # the same person counts once
    second = operator_call(proc.url, "approve", {"request_id": request_id}, bearer("bob", ["finance"]))
    assert (second.structured_content["status"], second.structured_content["approver"]) == (
        "granted", "mcp-operator:bob")
    view = store.get_approval(request_id)
    assert [(a.user, a.entitled) for a in view.approvers] == [("alice", ("four-eyes",)), ("bob", ("four-eyes",))]
    assert Event.objects.get(approval_id=request_id, type="APPROVAL_GRANTED").data["via"] == "mcp-operator"
    more = operator_call(proc.url, "approve", {"request_id": request_id}, bearer("carol", ["finance"]))
    assert code(more) == (-41003, "ctrlrun.approval_denied") and more.data["reason"] == "already granted"
    import ctrlrun

    with ctrlrun.context(agent="support-agent", user="rita"), ctrlrun.with_approval(request_id):
        assert refund(payment_id="txn_1", amount=60000)["amount"] == 60000


def test_an_approver_without_the_role_is_not_entitled(use_policy, refund, jwt_operator):
    use_policy(ONE_OF_FINANCE)
    request_id = ask(refund, user="rita")
    proc = jwt_operator(ONE_OF_FINANCE)
    for roles in ([], ["Finance"], ["finance "]):  # byte for byte: no case folding, no trimming
        refused = operator_call(proc.url, "approve", {"request_id": request_id}, bearer("dave", roles))
        assert code(refused) == (-41015, "ctrlrun.not_entitled")
        assert refused.data["role"] == "finance" and refused.data["control"] == "four-eyes"
    assert store.get_approval(request_id).status == "pending"
    claims = {"iss": ISSUER, "aud": "ctrlrun-operator", "sub": "x", "email": "dave", "roles": ["finance"],
              "exp": 4102444800}
    other_key = b"another-secret-of-at-least-32-bytes!!"
    forged = operator_call(proc.url, "approve", {"request_id": request_id},
                           {"authorization": "Bearer " + sign(claims, other_key, alg="HS256", typ=None)})
    assert code(forged) == (-41007, "ctrlrun.no_principal")
    ok = operator_call(proc.url, "approve", {"request_id": request_id}, bearer("erin", ["finance"]))
    assert ok.structured_content["status"] == "granted"


def test_resolving_an_ambiguous_record_by_the_verified_person(use_policy, refund, remote, headers_operator):
    use_policy(PLAIN)
    key = make_ambiguous(refund, remote)
    proc = headers_operator(PLAIN)
    listed = operator_call(proc.url, "effects", {"state": "ambiguous"})
    assert [e["effect_key"] for e in listed.structured_content["effects"]] == [key]
    assert code(operator_call(proc.url, "resolve", {"effect_key": key, "outcome": "failed", "reason": "x"})) == (
        -41007, "ctrlrun.no_principal")
    answer = operator_call(proc.url, "resolve", {"effect_key": key, "outcome": "failed",
                                                 "reason": "the bank shows no refund"}, person("console", "dana"))
    assert answer.structured_content == {"effect_key": key, "state": "failed", "resolver": "mcp-operator:dana",
                                         "reason": "the bank shows no refund", "retry_permitted": True}
    event = Event.objects.get(effect_key=key, type="EFFECT_RESOLVED")
    assert (event.data["resolved_by"], event.data["via"], event.data["reason"]) == (
        "human", "mcp-operator", "the bank shows no refund")
    again = operator_call(proc.url, "resolve", {"effect_key": key, "outcome": "committed", "reason": "oops"},
                          person("console", "dana"))
    assert code(again) == (-41003, "ctrlrun.approval_denied")
    assert store.verify().ok


def test_an_expired_token_is_refused_with_principal_expired(use_policy, refund, jwt_operator):
    import time

    use_policy(PLAIN)
    request_id = ask(refund, user="rita")
    proc = jwt_operator(PLAIN)

    def token(exp: int) -> dict[str, str]:
        claims = {"iss": ISSUER, "aud": "ctrlrun-operator", "sub": "assistant", "email": "dana", "exp": exp}
        return {"authorization": f"Bearer {sign(claims, SECRET.encode(), alg='HS256', typ=None)}"}

    # expired a moment ago (inside the provider's leeway): the principal is read and refused as expired
    lapsed = operator_call(proc.url, "approve", {"request_id": request_id}, token(int(time.time()) - 5))
    assert code(lapsed) == (-41014, "ctrlrun.principal_expired")
    # long expired: the provider itself refuses the token
    stale = operator_call(proc.url, "approve", {"request_id": request_id}, token(1000))
    assert code(stale) == (-41007, "ctrlrun.no_principal")
    assert store.get_approval(request_id).status == "pending"


@pytest.mark.parametrize(("flags", "said"), [
    ((), "name the operator's identity"),
    (("--principal-header", "x-agent"), "required together"),
    (("--identity-jwt", "--identity-jwt-issuer", "i", "--identity-jwt-audience", "a", "--identity-jwt-algorithm",
      "HS256"), "--identity-jwt-user-claim is required"),
    (("--listen", "0.0.0.0:8901", "--principal-header", "a", "--user-header", "u"), "not a loopback address"),
])
def test_bad_flags_are_said_plainly(tmp_path, flags, said):
    import subprocess
    import sys

    from tests.support import script_environment

    done = subprocess.run([sys.executable, "-m", "ctrlrun", "mcp-operator", *flags], cwd=tmp_path,
                          env=script_environment(tmp_path, PLAIN), capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and said in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_the_startup_block_says_what_answers_without_a_credential(use_policy, headers_operator):
    proc = headers_operator(PLAIN)
    proc.stop()
    printed = proc.proc.stdout.read()
    assert "ctrlrun mcp-operator on http://127.0.0.1:" in printed
    assert "identity headers x-agent / x-user (trusted as given)" in printed
    assert "answer without a credential" in printed and "need a verified human" in printed


def test_the_read_tools_answer_from_the_store(use_policy, refund, headers_operator):
    from tests.support import pay

    use_policy(PLAIN)
    pay(refund, "txn_5")
    request_id = ask(refund, user="rita")
    proc = headers_operator(PLAIN)
    [latest] = operator_call(proc.url, "receipts", {"limit": 1}).structured_content["receipts"]
    inspected = operator_call(proc.url, "inspect_action", {"action_id": latest["action_id"]}).structured_content
    assert inspected["schema"] == "ctrlrun.inspection/v2"
    assert inspected["receipts"][0]["action_id"] == latest["action_id"]
    asked = store.get_approval(request_id).action_id
    assert operator_call(proc.url, "inspect_action", {"action_id": asked}).structured_content["approvals"][0][
        "request_id"] == request_id
    assert operator_call(proc.url, "stats", {"since": "1h"}).structured_content["schema"] == "ctrlrun.stats/v1"
    assert operator_call(proc.url, "receipts", {"limit": 500}).code == -32602  # limit 1..200
