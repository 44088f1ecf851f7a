"""The policy file: YAML text -> a validated, immutable :class:`Policy` -> a decision per call.

Pure: the standard library and PyYAML only, no Django. The package reads in the order a policy
travels through it:

- :mod:`.loader`: a YAML *safe* load of hostile text, bounded before and while it is parsed
  (size, nesting, aliases and merge keys expanded), refusing duplicate keys, floats, dates, sets,
  non-string keys, control characters and format characters in keys, and remembering the line of
  every key and item so every complaint names file, line and key;
- :mod:`.schema`: the vocabulary (schemas v1..v8, the closed key set of each level with the schema
  that introduced each key, operators, limits, and the few keys whose behaviour is not built yet,
  which refuse the whole document by name rather than be ignored);
- :mod:`.reader`: validation, turning the loaded document into the model;
- :mod:`.model`: conditions, rules, entries and :class:`Policy.evaluate`, pure and cheap because
  it runs on every protected call;
- :mod:`.authority`: who may act, how much (grants, budgets, delegations, containment);
- :mod:`.documents`: the entry points (``parse_policy``, ``load_policy``, the authority file,
  grants as JSON) and the policy hash.

Every failure is a :class:`~ctrlrun.errors.PolicyError` whose message starts with the source
(a path or ``<string>``), then ``, line N`` when the line is known, then where in the document
(``action 'stripe.refund' rule[0]``) and what is wrong; the exception also carries ``source``,
``line`` and ``location``.
"""
from __future__ import annotations

from .documents import (
    AuthorityDocument,
    grant_from_json,
    grant_json,
    load_authority,
    load_policy,
    parse_authority,
    parse_grant,
    parse_policy,
    policy_hash,
)
from .loader import MAX_POLICY_BYTES, MAX_POLICY_DEPTH, MAX_POLICY_NODES
from .model import ActionEntry, Condition, ControlEntry, Evaluation, Policy, Rule
from .schema import KNOWN_SCHEMAS, MAX_CONTROL_ID, SUPPORTED_SCHEMAS
from ..states import Decision

__all__ = [
    "MAX_POLICY_BYTES",
    "MAX_POLICY_NODES",
    "MAX_POLICY_DEPTH",
    "MAX_CONTROL_ID",
    "SUPPORTED_SCHEMAS",
    "KNOWN_SCHEMAS",
    "Condition",
    "ControlEntry",
    "Rule",
    "ActionEntry",
    "Evaluation",
    "Decision",
    "Policy",
    "AuthorityDocument",
    "parse_policy",
    "parse_authority",
    "parse_grant",
    "grant_json",
    "grant_from_json",
    "load_policy",
    "load_authority",
    "policy_hash",
]
