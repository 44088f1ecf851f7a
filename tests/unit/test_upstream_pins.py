"""ctrlrun.upstream (§E3): the pins' hashes and the check, observed under the action name."""
from __future__ import annotations

import hashlib

import pytest

from ctrlrun import upstream
from ctrlrun.canonical import canonical_bytes

TOOL = {"name": "refund", "description": "Refund.", "inputSchema": {"type": "object", "properties": {}}}
URL = "http://127.0.0.1:1/mcp"


@pytest.fixture(autouse=True)
def clean():
    upstream.forget()
    yield
    upstream.forget()


def test_the_schema_hash_covers_the_whole_entry_under_its_schema_name():
    expected = hashlib.sha256(canonical_bytes({"schema": "ctrlrun.upstream.tool_schema/v1", "entry": TOOL})).hexdigest()
    assert upstream.tool_schema_hash(TOOL) == "sha256:" + expected
    assert upstream.tool_schema_hash({**TOOL, "description": "Refund twice."}) != upstream.tool_schema_hash(TOOL)


def test_a_schema_pin_is_looked_up_under_the_action_name_it_was_recorded_under():
    pin = {"tool_schema_sha256": upstream.tool_schema_hash(TOOL)}
    assert upstream.check(pin, URL, "mcp.pay.refund") == "upstream_unverified"
    upstream.observe_tool_schema(URL, "mcp.pay.refund", TOOL)
    assert upstream.check(pin, URL, "mcp.pay.refund") is None  # a matching pin is admitted
    upstream.observe_tool_schema(URL, "mcp.pay.refund", {**TOOL, "inputSchema": {"type": "object"}})
    assert upstream.check(pin, URL, "mcp.pay.refund") == "upstream_mismatch"
    upstream.observe_tool_schema(URL, "mcp.pay.refund", None)  # gone upstream
    assert upstream.check(pin, URL, "mcp.pay.refund") == "upstream_unverified"
    assert upstream.check(pin, None, "mcp.pay.refund") == "upstream_unverified"  # in-process: never verified
    assert upstream.check(None, URL, "mcp.pay.refund") is None


def test_a_certificate_pin_lists_digests_for_rotation():
    old, new = b"old certificate", b"new certificate"
    pin = {"tls_cert_sha256": (upstream.cert_hash(old), upstream.cert_hash(new))}
    assert upstream.check(pin, URL, "mcp.pay.refund") == "upstream_unverified"
    upstream.observe_certificate(URL, new)
    assert upstream.check(pin, URL, "mcp.pay.refund") is None
    upstream.observe_certificate(URL, b"someone else's")
    assert upstream.check(pin, URL, "mcp.pay.refund") == "upstream_mismatch"


def test_a_certificate_refusal_names_what_the_connection_presented():
    pinned, other = b"pinned certificate", b"other certificate"
    pin = {"tls_cert_sha256": (upstream.cert_hash(pinned),)}
    assert upstream.certificate_refusal(pin, pinned) is None
    assert upstream.cert_hash(other) in upstream.certificate_refusal(pin, other)
    assert "no TLS certificate" in upstream.certificate_refusal(pin, None)
    assert upstream.certificate_refusal({"tool_schema_sha256": "sha256:" + "0" * 64}, None) is None


def test_the_pinned_context_trusts_only_the_pinned_certificates(tmp_path):
    import ssl

    from tests.support import self_signed

    pinned = self_signed(tmp_path, "pinned")
    context = upstream.pinned_context([pinned.cert_file.read_text()])
    assert [cert["subject"] for cert in context.get_ca_certs()] == [((("commonName", "upstream pinned"),),)]
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert context.verify_flags & ssl.VERIFY_X509_PARTIAL_CHAIN
    with pytest.raises(ValueError):
        upstream.pinned_context([])


def test_the_policy_keeps_the_pinned_file_it_checked_not_the_file_later(tmp_path):
    from ctrlrun.policy import parse_policy
    from tests.support import self_signed

    pinned, other = self_signed(tmp_path, "pinned"), self_signed(tmp_path, "other")
    chain = tmp_path / "chain.pem"  # a file's first certificate is the one hashed and the one trusted
    chain.write_text(pinned.cert_file.read_text() + other.cert_file.read_text())
    policy = parse_policy(f"""\
schema: ctrlrun.policy/v8
actions:
  mcp.pay.refund:
    decision: allow
    upstream:
      tls_cert_sha256: ["{pinned.pin}"]
      tls_cert_file: "{chain}"
""")
    chain.write_text(other.cert_file.read_text())  # swapped after the policy was read
    (pem,) = policy.entry("mcp.pay.refund").upstream["tls_cert_pem"]
    assert upstream.pem_cert_hash(pem) == pinned.pin and pem.count("BEGIN CERTIFICATE") == 1
