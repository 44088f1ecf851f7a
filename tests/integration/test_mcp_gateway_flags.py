"""The gateway's authority and webhook flags (§E1, §C2, §D6): ``--authority FILE`` enforced and
summarised in the banner; ``--webhook-url`` delivering each approval request signed, with
``respond_to`` under ``--public-url`` answered by the gateway itself; every misuse refused with a
reason. Real processes: the SDK-built upstream, ``ctrlrun gateway``, a webhook receiver on loopback."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import httpx
import pytest

from ctrlrun.webhook import SCHEMA, sign, verify
from tests.support import (
    Receiver,
    executions,
    free_port,
    mcp_post,
    receipts,
    script_environment,
    start_gateway,
    start_upstream,
    tools_call,
)

pytestmark = pytest.mark.slow

POLICY = """\
schema: ctrlrun.policy/v3
actions:
  mcp.pay.refund:
    effect: "refund:{payment_id}"
    decision: allow
"""
APPROVING = POLICY.replace("decision: allow", "decision: approve")
GRANTS = """\
schema: ctrlrun.policy/v3
authority:
  grants:
    - id: support
      subject: {agent: "support-*"}
      actions: ["mcp.pay.*"]
"""
SECRET = "a-webhook-secret-for-the-gateway-tests-0123456789"


@pytest.fixture
def upstream(tmp_path):
    server = start_upstream(tmp_path)
    yield server
    server.stop()


def banner(proc) -> list[str]:
    lines = []
    while not lines or not lines[-1].startswith("actions:"):
        lines.append(proc.proc.stdout.readline().rstrip("\n"))
    return lines


def refused(tmp_path, *arguments, policy=POLICY, env=None):
    environment = {**script_environment(tmp_path, policy), **(env or {})}
    environment.pop("CTRLRUN_WEBHOOK_SECRET", None)
    done = subprocess.run([sys.executable, "-m", "ctrlrun", "gateway", "--upstream", "http://127.0.0.1:1/mcp",
                           "--alias", "pay", "--principal", "agent-1", *arguments], cwd=tmp_path, env=environment,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0, done.stdout
    assert "Traceback" not in done.stderr, done.stderr
    assert SECRET not in done.stderr + done.stdout
    return done.stderr


def test_an_authority_file_is_enforced_and_the_banner_names_it(tmp_path, upstream, store_db):
    grants = tmp_path / "grants.yaml"
    grants.write_text(GRANTS)
    gateway = start_gateway(tmp_path, upstream.url, POLICY, "--authority", str(grants),
                            identity=("--principal-header", "x-agent"))
    try:
        said = banner(gateway)
        allowed = mcp_post(gateway.url, tools_call("refund", {"payment_id": "p1", "amount": 5}),
                           headers={"x-agent": "support-bot"})
        denied = mcp_post(gateway.url, tools_call("refund", {"payment_id": "p2", "amount": 5}),
                          headers={"x-agent": "mallory"})
    finally:
        gateway.stop()
    assert f"authority: 1 grant from the authority file {grants} (support); a call no grant permits is refused " \
           f"-41012" in said, said
    assert allowed[0] == 200 and allowed[1]["result"]["_meta"]["com.ctrlrun/receipt"]["result"] == "committed"
    assert denied[0] == 403 and denied[1]["error"]["code"] == -41012
    assert denied[1]["error"]["data"]["reason"] == "no_authority"
    assert executions(upstream) == ["refund p1 5"]


def test_without_an_authority_the_banner_says_everyone_is_unrestricted(tmp_path, upstream, store_db):
    gateway = start_gateway(tmp_path, upstream.url, POLICY)
    try:
        said = banner(gateway)
    finally:
        gateway.stop()
    assert ("authority: none (the policy has no authority: section and there is no --authority file, so every "
            "principal is unrestricted)") in said
    assert "approvals: answered on the console or with `ctrlrun approve` (no --webhook-url)" in said


def test_a_webhook_request_is_delivered_signed_and_answered_at_the_gateway(tmp_path, upstream, store_db):
    receiver = Receiver()
    secret_file = tmp_path / "webhook.secret"
    secret_file.write_text(SECRET + "\n")
    port = free_port()
    public = f"http://127.0.0.1:{port}"
    gateway = start_gateway(tmp_path, upstream.url, APPROVING, "--webhook-url", receiver.url, "--allow-insecure-webhook",
                            "--webhook-secret-file", str(secret_file), "--public-url", public, port=port)
    call = tools_call("refund", {"payment_id": "b1", "amount": 900})
    try:
        said = banner(gateway)
        status, waiting = mcp_post(gateway.url, call)
        assert status == 403 and waiting["error"]["code"] == -41002, waiting
        request_id = waiting["error"]["data"]["request_id"]
        deadline = time.monotonic() + 60
        while not receiver.posts and time.monotonic() < deadline:
            time.sleep(0.05)
        (headers, body), = receiver.posts
        delivered = json.loads(body)
        answer = json.dumps({"request_id": request_id, "action_hash": delivered["action_hash"], "decision": "grant",
                             "approver": "slack:U123"}).encode()
        forged = httpx.post(delivered["respond_to"], content=answer,
                            headers={"CTRLRun-Signature": sign(answer, "x" * 40)})
        before = mcp_post(gateway.url, call)
        taken = httpx.post(delivered["respond_to"], content=answer, headers={"CTRLRun-Signature": sign(answer, SECRET)})
        again = httpx.post(delivered["respond_to"], content=answer, headers={"CTRLRun-Signature": sign(answer, SECRET)})
        status, done = mcp_post(gateway.url, call)
    finally:
        gateway.stop()
        receiver.close()
    assert (f"approvals: each request delivered, signed, to {receiver.url}; respond_to "
            f"{public}/ctrlrun/approvals/<id>; signed answers taken at POST /ctrlrun/approvals/<id>") in said
    signature = next(value for name, value in headers.items() if name.lower() == "ctrlrun-signature")
    assert verify(signature, body, SECRET)
    assert delivered["schema"] == SCHEMA and delivered["request_id"] == request_id
    assert delivered["action"]["name"] == "mcp.pay.refund"
    assert delivered["respond_to"] == f"{public}/ctrlrun/approvals/{request_id}"
    assert forged.status_code == 400 and "signature" in forged.text.lower()
    assert before[0] == 403 and before[1]["error"]["code"] == -41002  # the forged answer changed nothing
    assert (taken.status_code, taken.text.strip()) == (200, "ok")
    assert (again.status_code, again.text.strip()) == (200, "already granted")
    assert status == 200 and done["result"]["_meta"]["com.ctrlrun/receipt"]["result"] == "committed"
    assert executions(upstream) == ["refund b1 900"]
    assert [r["result"] for r in receipts()] == ["committed"]


def test_without_a_webhook_the_gateway_takes_no_answers(tmp_path, upstream, store_db):
    gateway = start_gateway(tmp_path, upstream.url, POLICY)
    try:
        answer = httpx.post(gateway.url.replace("/mcp", "/ctrlrun/approvals/apr_x"), content=b"{}")
    finally:
        gateway.stop()
    assert answer.status_code == 404


@pytest.mark.parametrize("arguments, says", [
    (["--public-url", "https://gateway.example"], "--public-url goes with --webhook-url"),
    (["--allow-insecure-webhook"], "--allow-insecure-webhook goes with --webhook-url"),
    (["--webhook-secret-file", "secret", "--public-url", "https://gateway.example"],
     "--public-url, --webhook-secret-file go with --webhook-url"),
    (["--webhook-url", "https://hooks.example/approvals"], "no webhook secret"),
    (["--webhook-url", "https://hooks.example/approvals", "--webhook-secret-file", "missing.secret"],
     "cannot read the webhook secret file"),
    (["--webhook-url", "https://hooks.example/approvals", "--webhook-secret-file", "short.secret"],
     "at least 32 bytes"),
    (["--webhook-url", "http://127.0.0.1:9/approvals", "--webhook-secret-file", "good.secret"],
     "--allow-insecure-webhook permits http to a loopback address"),
    (["--webhook-url", "http://hooks.example/approvals", "--webhook-secret-file", "good.secret",
      "--allow-insecure-webhook"], "only permits http to 127.0.0.1"),
    (["--webhook-url", "https://hooks.example/approvals", "--webhook-secret-file", "good.secret",
      "--public-url", "http://gateway.example"], "is http to a host that is not loopback"),
    (["--authority", "missing.yaml"], "missing.yaml"),
    (["--authority", "rules.yaml"], "actions"),
])
def test_the_authority_and_webhook_flags_refuse_with_a_reason(tmp_path, store_db, arguments, says):
    (tmp_path / "short.secret").write_text("too short")
    (tmp_path / "good.secret").write_text(SECRET)
    (tmp_path / "rules.yaml").write_text(POLICY)  # a policy is not an authority document
    assert says in refused(tmp_path, *arguments)


def test_an_authority_file_beside_an_inline_section_is_refused(tmp_path, store_db):
    (tmp_path / "grants.yaml").write_text(GRANTS)
    inline = POLICY + GRANTS.split("\n", 1)[1]
    said = refused(tmp_path, "--authority", "grants.yaml", policy=inline)
    assert "authority" in said


def test_an_authority_file_other_than_the_process_one_is_refused(tmp_path, store_db):
    (tmp_path / "grants.yaml").write_text(GRANTS)
    (tmp_path / "other.yaml").write_text(GRANTS)
    said = refused(tmp_path, "--authority", "grants.yaml", env={"CTRLRUN_AUTHORITY": str(tmp_path / "other.yaml")})
    assert "--authority grants.yaml and CTRLRUN_AUTHORITY" in said and "name different files" in said
