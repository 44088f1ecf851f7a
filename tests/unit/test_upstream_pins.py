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
