"""The format's vocabulary: the schemas, the keys each level may hold (with the schema that
introduced each), the operators and the limits. Pure: no Django."""

from __future__ import annotations

import logging
import re

from ..states import Decision


logger = logging.getLogger("ctrlrun.policy")

#: Every schema of the format. Each is a superset of the one before; this version reads them all.
KNOWN_SCHEMAS = tuple(f"ctrlrun.policy/v{n}" for n in range(1, 9))
#: The schemas this version reads (all of them; a few features of the later ones are refused by
#: name until they are built, see :data:`NOT_BUILT`).
SUPPORTED_SCHEMAS = KNOWN_SCHEMAS
SCHEMA_VERSION = {name: number for number, name in enumerate(KNOWN_SCHEMAS, start=1)}
NEWEST_SUPPORTED = SUPPORTED_SCHEMAS[-1]

# Closed key sets: every key the format defines at each level, with the schema it first
# appears in. A key missing here is unknown at any schema; a key present with a number above
# the document's schema is refused naming that schema.
TOP_KEYS = {
    "schema": 1,
    "actions": 1,
    "environment": 3,
    "authority": 3,
    "mode": 3,
    "version": 4,
    "controls": 4,
}
ENTRY_KEYS = {
    "decision": 1,
    "rules": 1,
    "effect": 2,
    "resource": 2,
    "mcp": 2,
    "controls": 4,
    "data": 4,
    "max_attempts": 5,
    "approvals_required": 6,
    "upstream": 8,
}
RULE_KEYS = {"when": 1, "decision": 1, "controls": 4}
MCP_KEYS = {"not_executed_on_error": 2}
CONTROL_KEYS = {"title": 4, "source": 4, "approver_role": 6}
DATA_KEYS = {"label": 4}
UPSTREAM_KEYS = {"tls_cert_sha256": 8, "tls_cert_file": 8, "tool_schema_sha256": 8}
AUTHORITY_KEYS = {"max_delegation_depth": 3, "grants": 3, "break_glass": 3}
BUDGET_KEYS = {"metric": 7, "limit": 7, "window": 7}
#: A budget's optional keys (the port's: the reference has none of them).
BUDGET_OPTIONAL = {"currency": 7}
CURRENCY = re.compile(r"[A-Z]{3}")
GRANT_KEYS = {
    "id": 3, "subject": 3, "actions": 3, "resources": 3, "constraints": 3, "environments": 3,
    "expires_at": 3, "delegable": 3, "tasks": 7, "budgets": 7,
}
MODES = ("enforce", "observe")
#: The longest control id; ids are shown in the console and on every receipt that cites them.
MAX_CONTROL_ID = 200

#: Features of the format that this version reads and validates but cannot enforce yet. A policy
#: that uses one is refused whole, never half-applied: ignoring ``approvals_required: 2`` would let
#: one person approve what needs two.
NOT_BUILT = {
    "break_glass": "'break_glass' envelopes (opened by an approver; not publicly invocable in the reference either)",
}

#: Action name reserved for the approved-policy flow of v6; no earlier document may use it.
POLICY_CHANGE_ACTION = "ctrlrun.policy.change"
#: Effect keys starting with this are ctrlrun's own (policy changes); a user template may not mint them.
RESERVED_EFFECT_PREFIX = "policy:"

#: Condition operators. Splitting tries the suffixes in this order, which is longest first, so
#: ``x_neq_eq`` is (x_neq, eq) and ``amount_neq`` is (amount, neq), never (amount_n, eq).
SPLIT_ORDER = ("neq", "lte", "gte", "eq", "in", "lt", "gt")
NUMERIC_OPS = frozenset({"lt", "lte", "gt", "gte"})
OPS_LISTED = ", ".join(sorted(SPLIT_ORDER))
#: Names of Action fields. A condition is about the call's arguments only; letting ``user_eq``
#: silently test an argument called ``user`` would read as a check on the principal.
RESERVED_SUBJECTS = frozenset(
    {"action_id", "agent", "claims", "environment", "expires_at", "issuer", "principal", "resource", "user"}
)
#: A subject derived from the entry's ``data`` (v4), not an argument.
DERIVED_SUBJECT = "data_scope"

DECISIONS = {d.value: d for d in Decision}
DECISIONS_LISTED = ", ".join(d.value for d in Decision)

