"""The policy file: YAML text -> a validated, immutable :class:`Policy` -> a decision per call.

Pure: the standard library and PyYAML only, no Django. Three stages, each in its own section:

1. **Loading** (:func:`_load_yaml`). A YAML *safe* load that also refuses duplicate keys and
   remembers the line of every mapping key and list item, so that every later complaint can
   name file, line and key. Floats, ``!!binary``, dates, sets and non-string keys are refused
   anywhere in the document: the whole ``actions`` mapping is hashed through
   :func:`~ctrlrun.canonical.canonical_bytes`, which has no stable form for them. Only plain
   decimal integers are ints (``010``, ``0x10``, ``1:30``, ``1_000`` are refused, saying what
   YAML would have made of them). The text is treated as hostile: its size
   (:data:`MAX_POLICY_BYTES`) is checked before parsing, control characters (raw or escaped)
   and lone surrogates are refused, and so are format characters (bidi controls, zero-width
   characters) in keys; the composer (:class:`_Composer`) bounds nesting
   (:data:`MAX_POLICY_DEPTH`) and the size of the document once aliases and merge keys are
   expanded (:data:`MAX_POLICY_NODES`), so an alias bomb is refused before anything walks it.
   libyaml's parser is used when PyYAML has it, the pure-Python one otherwise.
2. **Validation** (:class:`_Reader`). Closed key sets at every level; a key that belongs to a
   later schema than the document declares is refused naming the schema it needs (an older reader
   would not know it). Every key of v1..v8 is read and validated; the few whose behaviour this
   version does not have yet (``_NOT_BUILT``: ``authority``, M-of-N approvals, ``approver_role``,
   ``upstream``, the ``ctrlrun.policy.change`` action) refuse the whole document by name, because
   silently ignoring e.g. an ``authority:`` section would make the policy *more* permissive than
   its author wrote.
3. **Evaluation** (:meth:`Policy.evaluate`). Pure and cheap: it runs on every protected call,
   so everything that can be decided at load time (condition operators, operand checks, the
   :class:`Evaluation` objects themselves) is decided there.

Every failure is a :class:`~ctrlrun.errors.PolicyError` whose message starts with the source
(a path or ``<string>``), then ``, line N`` when the line is known, then where in the document
(``action 'stripe.refund' rule[0]``) and what is wrong. The raised exception also carries
``source``, ``line`` and ``location`` attributes for callers that want them separately.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import datetime as dt
import gc
import logging
import os
import re
import types
import unicodedata
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from .authority import MAX_AMOUNT, Authority, Budget, Grant, parse_window, validate_pattern
from .canonical import DEFAULT_ENVIRONMENT, Template, canonical_bytes, sha256_hash
from .errors import InvalidArgument, PolicyError
from .states import Decision

__all__ = [
    "MAX_POLICY_BYTES",
    "MAX_POLICY_NODES",
    "MAX_POLICY_DEPTH",
    "SUPPORTED_SCHEMAS",
    "KNOWN_SCHEMAS",
    "Condition",
    "ControlEntry",
    "Rule",
    "ActionEntry",
    "Evaluation",
    "Policy",
    "parse_policy",
    "parse_grant",
    "grant_from_json",
    "load_policy",
]

logger = logging.getLogger("ctrlrun.policy")

#: Every schema of the format. Each is a superset of the one before; this version reads them all.
KNOWN_SCHEMAS = tuple(f"ctrlrun.policy/v{n}" for n in range(1, 9))
#: The schemas this version reads (all of them; a few features of the later ones are refused by
#: name until they are built, see :data:`_NOT_BUILT`).
SUPPORTED_SCHEMAS = KNOWN_SCHEMAS
_SCHEMA_VERSION = {name: number for number, name in enumerate(KNOWN_SCHEMAS, start=1)}
_NEWEST_SUPPORTED = SUPPORTED_SCHEMAS[-1]

# Closed key sets: every key the format defines at each level, with the schema it first
# appears in. A key missing here is unknown at any schema; a key present with a number above
# the document's schema is refused naming that schema.
_TOP_KEYS = {
    "schema": 1,
    "actions": 1,
    "environment": 3,
    "authority": 3,
    "mode": 3,
    "version": 4,
    "controls": 4,
}
_ENTRY_KEYS = {
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
_RULE_KEYS = {"when": 1, "decision": 1, "controls": 4}
_MCP_KEYS = {"not_executed_on_error": 2}
_CONTROL_KEYS = {"title": 4, "source": 4, "approver_role": 6}
_DATA_KEYS = {"label": 4}
_UPSTREAM_KEYS = {"tls_cert_sha256": 8, "tls_cert_file": 8, "tool_schema_sha256": 8}
_AUTHORITY_KEYS = {"max_delegation_depth": 3, "grants": 3, "break_glass": 3}
_BUDGET_KEYS = {"metric": 7, "limit": 7, "window": 7}
#: A budget's optional keys (the port's: the reference has none of them).
_BUDGET_OPTIONAL = {"currency": 7}
_CURRENCY = re.compile(r"[A-Z]{3}")
_GRANT_KEYS = {
    "id": 3, "subject": 3, "actions": 3, "resources": 3, "constraints": 3, "environments": 3,
    "expires_at": 3, "delegable": 3, "tasks": 7, "budgets": 7,
}
_MODES = ("enforce", "observe")
#: The longest control id; ids are shown in the console and on every receipt that cites them.
MAX_CONTROL_ID = 200

#: Features of the format that this version reads and validates but cannot enforce yet. A policy
#: that uses one is refused whole, never half-applied: ignoring an ``authority:`` section would
#: let every principal do what the actions allow, and ignoring ``approvals_required: 2`` would let
#: one person approve what needs two.
_NOT_BUILT = {
    "break_glass": "'break_glass' envelopes (opened by an approver; not publicly invocable in the reference either)",
    "approvals_required": "'approvals_required' above 1 (M-of-N approvals)",
    "approver_role": "'approver_role' on a control (verified approvers)",
    "upstream": "'upstream' pins (the MCP gateway)",
    "policy_change": "the 'ctrlrun.policy.change' action (the approved-policy flow)",
}

#: Action name reserved for the approved-policy flow of v6; no earlier document may use it.
_POLICY_CHANGE_ACTION = "ctrlrun.policy.change"
#: Effect keys starting with this are ctrlrun's own (policy changes); a user template may not mint them.
_RESERVED_EFFECT_PREFIX = "policy:"

#: Condition operators. Splitting tries the suffixes in this order, which is longest first, so
#: ``x_neq_eq`` is (x_neq, eq) and ``amount_neq`` is (amount, neq), never (amount_n, eq).
_SPLIT_ORDER = ("neq", "lte", "gte", "eq", "in", "lt", "gt")
_NUMERIC_OPS = frozenset({"lt", "lte", "gt", "gte"})
_OPS_LISTED = ", ".join(sorted(_SPLIT_ORDER))
#: Names of Action fields. A condition is about the call's arguments only; letting ``user_eq``
#: silently test an argument called ``user`` would read as a check on the principal.
_RESERVED_SUBJECTS = frozenset(
    {"action_id", "agent", "claims", "environment", "expires_at", "issuer", "principal", "resource", "user"}
)
#: A subject derived from the entry's ``data`` (v4), not an argument.
_DERIVED_SUBJECT = "data_scope"

_DECISIONS = {d.value: d for d in Decision}
_DECISIONS_LISTED = ", ".join(d.value for d in Decision)


# --------------------------------------------------------------------------------------------
# The data model
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Evaluation:
    """What the policy says about one call, and why.

    ``reason`` is ``"decision"`` (a bare entry decision), ``"rule[N]"`` (0-based, the first
    matching rule), ``"unknown_action"`` or ``"no_matching_rule"`` (both deny).
    """

    decision: Decision
    reason: str
    #: The controls cited for this verdict (v4): the entry's and the matched rule's, in the
    #: order of the ``controls:`` registry. Empty when nothing is cited.
    controls: tuple[str, ...] = ()


_UNKNOWN_ACTION = Evaluation(Decision.DENY, "unknown_action")
_NO_MATCHING_RULE = Evaluation(Decision.DENY, "no_matching_rule")


def _equal(left: Any, right: Any) -> bool:
    """Type-strict, recursive equality: ``True != 1``, ``"1" != 1``, lists by order, maps by keys.

    Python's ``==`` says ``True == 1`` and ``1 == 1.0``; a policy that allows ``approved_eq:
    true`` must not be satisfied by ``approved=1``. Tuples count as lists because the canonical
    form of an argument turns tuples into lists.
    """
    if isinstance(left, (list, tuple)):
        return (
            isinstance(right, (list, tuple))
            and len(left) == len(right)
            and all(_equal(a, b) for a, b in zip(left, right))
        )
    if isinstance(left, Mapping):
        if not isinstance(right, Mapping) or len(left) != len(right):
            return False
        for key, value in left.items():
            if key not in right or not _equal(value, right[key]):
                return False
        return True
    if isinstance(right, (list, tuple, Mapping)):
        return False  # a container never equals a scalar
    if isinstance(left, bool) or isinstance(right, bool):
        return left is right  # both bools and the same one (bools are singletons)
    if isinstance(left, int):
        return isinstance(right, int) and left == right
    if isinstance(left, str):
        return isinstance(right, str) and left == right
    return type(left) is type(right) and left == right


def _is_int(value: Any) -> bool:
    """An int that is not a bool (``bool`` subclasses ``int``; ``True >= 0`` must not pass)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _numeric(compare: Callable[[int, int], bool]) -> Callable[[Condition, str, Any], bool]:
    def test(condition: Condition, action: str, value: Any) -> bool:
        if value.__class__ is int or _is_int(value):
            return compare(value, condition.operand)
        logger.warning(
            "%s: condition %s ignored: argument '%s' is %s, not int",
            action, condition.key, condition.argument, type(value).__name__,
        )
        return False

    return test


def _test_eq(condition: Condition, action: str, value: Any) -> bool:
    return _equal(value, condition.operand)


def _test_neq(condition: Condition, action: str, value: Any) -> bool:
    return not _equal(value, condition.operand)


def _test_in(condition: Condition, action: str, value: Any) -> bool:
    return any(_equal(value, item) for item in condition.operand)


def _test_scope_in(condition: Condition, action: str, value: Any) -> bool:
    """``data_scope_in``: the call carries at least one of the listed labels."""
    return any(label in condition.operand for label in value)


_TESTS: dict[str, Callable[[Condition, str, Any], bool]] = {
    "eq": _test_eq,
    "neq": _test_neq,
    "in": _test_in,
    "lt": _numeric(lambda a, b: a < b),
    "lte": _numeric(lambda a, b: a <= b),
    "gt": _numeric(lambda a, b: a > b),
    "gte": _numeric(lambda a, b: a >= b),
}


@dataclass(frozen=True)
class Condition:
    """One ``<argument>_<op>: operand`` entry of a rule's ``when``.

    The operand has been checked at load time (an int for ``lt``/``lte``/``gt``/``gte``, a list
    for ``in``, a scalar, mapping or flat list for ``eq``/``neq``), so :meth:`holds` only has to
    look at the argument.
    """

    key: str
    argument: str
    op: str
    operand: Any
    _test: Callable[[Condition, str, Any], bool] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        test = _TESTS.get(self.op)
        if test is None:
            raise InvalidArgument(f"unknown condition operator {self.op!r}; expected one of {_OPS_LISTED}")
        if self.argument == _DERIVED_SUBJECT and self.op == "in":
            test = _test_scope_in  # any label of the call's among the listed ones
        object.__setattr__(self, "_test", test)

    def holds(self, action: str, arguments: Mapping[str, Any]) -> bool:
        """Whether the condition holds for ``arguments`` of a call to ``action``.

        For the derived subject ``data_scope`` (v4) the entry passes the call's labels in
        ``arguments`` under that name (it can be no argument's name: it is reserved).

        A missing argument makes the condition false for every operator, ``neq`` included: a
        rule written about an argument says nothing about calls without it, and treating
        "absent" as "not equal" would let such calls through an ``allow`` rule.
        """
        try:
            value = arguments[self.argument]
        except KeyError:
            logger.warning(
                "%s: condition %s ignored: the action has no argument '%s' (it has: %s)",
                action, self.key, self.argument, ", ".join(sorted(arguments)) or "no arguments",
            )
            return False
        return self._test(self, action, value)


@dataclass(frozen=True)
class Rule:
    """One element of an entry's ``rules``: all of ``when`` (ANDed; empty = always) -> ``decision``.

    ``controls`` is what a match cites: the entry's citations and the rule's own, in registry order.
    """

    index: int
    when: tuple[Condition, ...]
    decision: Decision
    controls: tuple[str, ...] = ()
    _evaluation: Evaluation = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Built once here: evaluate() hands out this same frozen object on every match.
        object.__setattr__(self, "_evaluation",
                           Evaluation(Decision(self.decision), f"rule[{self.index}]", self.controls))

    def matches(self, action: str, arguments: Mapping[str, Any]) -> bool:
        """Whether every condition holds (stops at the first that does not)."""
        for condition in self.when:
            if not condition.holds(action, arguments):
                return False
        return True


@dataclass(frozen=True)
class ActionEntry:
    """The policy for one action name: a bare ``decision`` or ordered ``rules`` (never both).

    ``effect`` and ``resource`` are the entry's templates (schema v2), ``mcp`` the gateway's
    options as written (a plain dict), each None when absent. From v4: ``controls`` (the entry's
    citations, in registry order) and ``data`` (argument name -> data label); from v5
    ``max_attempts`` (None: unbounded); from v6 ``approvals_required`` (1 unless written).
    """

    name: str
    decision: Decision | None
    rules: tuple[Rule, ...]
    effect: Template | None = None
    resource: Template | None = None
    mcp: dict | None = None
    controls: tuple[str, ...] = ()
    data: Mapping[str, str] = field(default_factory=dict)
    max_attempts: int | None = None
    approvals_required: int = 1
    _evaluation: Evaluation | None = field(init=False, repr=False, compare=False)
    _no_match: Evaluation = field(init=False, repr=False, compare=False)
    _scoped: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        fixed = None if self.decision is None else Evaluation(Decision(self.decision), "decision", self.controls)
        object.__setattr__(self, "_evaluation", fixed)
        no_match = Evaluation(Decision.DENY, "no_matching_rule", self.controls) if self.controls else _NO_MATCHING_RULE
        object.__setattr__(self, "_no_match", no_match)
        scoped = any(c.argument == _DERIVED_SUBJECT for rule in self.rules for c in rule.when)
        object.__setattr__(self, "_scoped", scoped)

    def data_scope(self, arguments: Mapping[str, Any]) -> list[str]:
        """The labels of this call's data (v4): those of the labelled arguments present, sorted, once each."""
        return sorted({label for argument, label in self.data.items() if argument in arguments})

    def evaluate(self, arguments: Mapping[str, Any]) -> Evaluation:
        """The entry's verdict: its bare decision, else the first matching rule, else deny."""
        if self._evaluation is not None:
            return self._evaluation
        if self._scoped:  # the derived subject, where the rules can see it (never an argument's name)
            arguments = {**arguments, _DERIVED_SUBJECT: self.data_scope(arguments)}
        for rule in self.rules:
            if rule.matches(self.name, arguments):
                return rule._evaluation
        return self._no_match


@dataclass(frozen=True)
class ControlEntry:
    """One entry of the ``controls:`` registry (v4): the written expectation a decision is attributed to."""

    id: str
    title: str
    source: str | None = None
    approver_role: str | None = None


@dataclass(frozen=True)
class Policy:
    """A loaded, validated policy document. Immutable; ``evaluate`` is pure.

    ``hash`` identifies the rules that decided a call (§1.7): it covers the actions as written
    (formatting and key order aside), the schema, the environment and the mode, so receipts and
    approvals can be traced back to the exact document. ``text`` is the document as read.
    """

    schema: str
    actions: Mapping[str, ActionEntry]
    hash: str
    source: str
    text: str
    environment: str
    #: ``enforce``, or ``observe`` (v3): every call runs and receipts say what would have happened.
    mode: str = "enforce"
    #: The document's ``version:`` label (v4), recorded on receipts as ``policy_version``; not hashed.
    version: str | None = None
    #: The ``controls:`` registry (v4): control id -> :class:`ControlEntry`, in the order written.
    controls: Mapping[str, ControlEntry] = field(default_factory=dict)
    #: The ``authority:`` section (v3), or None: without one, authority is not checked.
    authority: Authority | None = None
    #: The standalone authority file the grants came from (§C2), when they are not inline.
    authority_document: Any = None

    def __hash__(self) -> int:
        # The generated hash would try to hash the actions mapping; the policy hash already
        # identifies the content.
        return hash((self.hash, self.source, self.text))

    @property
    def observing(self) -> bool:
        """Whether this policy is in observe mode (nothing is refused; see ``mode``)."""
        return self.mode == "observe"

    def entry(self, name: str) -> ActionEntry | None:
        """The entry for ``name`` (matched exactly), or None when the policy does not name it."""
        return self.actions.get(name)

    def evaluate(self, name: str, arguments: Mapping[str, Any]) -> Evaluation:
        """Decide a call to ``name`` with (canonical) ``arguments``. Pure; never raises on arguments.

        There is no default allow: an action the policy does not name is denied.
        """
        entry = self.actions.get(name)
        if entry is None:
            return _UNKNOWN_ACTION
        return entry.evaluate(arguments)


# --------------------------------------------------------------------------------------------
# Loading: bounded, strict YAML with duplicate-key refusal and line numbers
# --------------------------------------------------------------------------------------------

#: The largest policy accepted, in UTF-8 bytes, checked before anything is parsed. A large real
#: policy (1,000 actions) is 100-200 KB, so 1 MiB leaves five to ten times that; it loads in
#: well under a second with libyaml, and the text is stored in the database on every change.
MAX_POLICY_BYTES = 1 << 20
#: The most nodes (scalars, lists, mappings) a document may hold once every alias is expanded,
#: counted while it is composed. A real 1,000-action policy has about 25,000 and one filling
#: MAX_POLICY_BYTES about 115,000; 2**18 is ten times the first and twice the second, small enough
#: that the walks that follow (the value check, the plain copy, hashing) stay well under a second.
MAX_POLICY_NODES = 1 << 18
#: The deepest nesting of lists and mappings, the top-level mapping being level 1. A policy
#: needs 7 (top level, actions, entry, rules, rule, when, operand); 64 leaves room for nested
#: operands while keeping every recursive walk far below Python's recursion limit.
MAX_POLICY_DEPTH = 64
# No separate limit on the number of aliases: each costs a dictionary lookup when the document
# is composed (the expanded size of its target is remembered), so what aliases can do is bounded
# by MAX_POLICY_NODES and their number by MAX_POLICY_BYTES.

#: Whether PyYAML was built with libyaml; without it the pure-Python parser is used.
_HAVE_LIBYAML: bool = bool(getattr(yaml, "__with_libyaml__", False))
#: Use libyaml's parser when there is one: it scans and parses several times faster and gives the
#: same marks (lines). Composition, resolution and construction are Python in both cases, so the
#: limits and the messages are the same; tests switch this off to exercise the fallback.
_USE_LIBYAML: bool = _HAVE_LIBYAML

_MERGE_TAG = "tag:yaml.org,2002:merge"
_VALUE_TAG = "tag:yaml.org,2002:value"
_STR_TAG = "tag:yaml.org,2002:str"

#: Characters refused anywhere in the raw text: what PyYAML's reader refuses (C0 controls but
#: tab, LF and CR; DEL; C1 controls; lone surrogates; U+FFFE/U+FFFF), plus NEL (U+0085), which
#: YAML 1.1 would read as a line break that no editor shows.
_FORBIDDEN_IN_TEXT = re.compile("[^\t\n\r\x20-\x7e\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
#: Characters refused inside a string value or key (only escapes can put them there once the
#: raw text has passed): controls other than tab, LF and CR, and lone surrogates.
_FORBIDDEN_IN_STRING = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff]")
#: Line breaks as YAML counts them (NEL, which it also counts, is refused).
_LINE_BREAK = re.compile("\r\n|\r|\n|\u2028|\u2029")
_C0_NAMES = (
    "NUL SOH STX ETX EOT ENQ ACK BEL BS HT LF VT FF CR SO SI "
    "DLE DC1 DC2 DC3 DC4 NAK SYN ETB CAN EM SUB ESC FS GS RS US"
).split()
_C1_NAMES = {0x7F: "DEL", 0x85: "NEL", 0x9B: "CSI"}
_STORAGE_REASON = "the text is stored in the database, which cannot hold NUL, and shown on screens"


class _YamlMap(dict):
    """A mapping as loaded, remembering its own line and the line of each key (1-based)."""

    line: int
    key_lines: dict[Any, int]


class _YamlList(list):
    """A sequence as loaded, remembering its own line and the line of each item (1-based)."""

    line: int
    item_lines: list[int]


@dataclass(frozen=True, eq=False)
class _Refused:
    """A value YAML can express but a policy may not hold (a float, a date, ``!!binary`` ...).

    Built by the loader instead of the real value so the refusal can name the value's own line;
    the path is only known once the tree is walked. ``eq=False`` keeps it hashable by identity,
    since it may appear as a mapping key. ``message`` (and ``key_message``, for a key) replace
    the generic sentence when the refusal needs its own.
    """

    what: str
    text: str
    line: int
    message: str = ""
    key_message: str = ""

    def describe(self) -> str:
        return f"{self.what} ({self.text})" if self.text else self.what


_REFUSED_HINTS = {
    "a float": "use an int (e.g. minor units: 2000.00 -> 200000) or quote it as a string",
    "a date": "quote it to make it a string",
    "a timestamp": "quote it to make it a string",
    "a !!binary value": "use a string",
    "a !!set": "use a list",
    "an !!omap": "use a mapping",
    "a !!pairs": "use a mapping or a list",
}


class _Refusal(Exception):
    """A limit or character rule broken while loading: becomes a PolicyError at ``line``."""

    def __init__(self, line: int | None, message: str) -> None:
        super().__init__(message)
        self.line = line
        self.message = message


def _line(node: Node) -> int:
    return node.start_mark.line + 1


def _describe_character(char: str) -> str:
    """``the control character U+0000 (NUL)``, ``the format character U+202E (RIGHT-TO-LEFT OVERRIDE)``."""
    code = ord(char)
    if 0xD800 <= code <= 0xDFFF:
        return f"the lone surrogate U+{code:04X} (half of a UTF-16 pair, not a character)"
    category = unicodedata.category(char)
    name = unicodedata.name(char, "") or (_C0_NAMES[code] if code < 0x20 else _C1_NAMES.get(code, ""))
    kinds = {"Cc": "control character", "Cf": "format character", "Cn": "noncharacter"}
    kind = kinds.get(category, "character")
    return f"the {kind} U+{code:04X}" + (f" ({name})" if name else "")


def _shown(text: str) -> str:
    """``repr`` of a string, shortened: enough to find it, with every hidden character escaped."""
    shown = repr(text)
    return shown if len(shown) <= 60 else shown[:56] + "...'"


def _check_text(text: str, source: str) -> None:
    """Refuse, before parsing, a text over MAX_POLICY_BYTES or holding a forbidden character."""
    if len(text) > MAX_POLICY_BYTES or (not text.isascii() and _utf8_size(text) > MAX_POLICY_BYTES):
        raise _size_error(source, f"the policy is {_utf8_size(text):,} bytes")
    found = _FORBIDDEN_IN_TEXT.search(text)
    if found is None:
        return
    position = found.start()
    breaks = list(_LINE_BREAK.finditer(text, 0, position))
    line = len(breaks) + 1
    column = position - (breaks[-1].end() if breaks else 0) + 1
    character = _describe_character(found.group())
    if "\ud800" <= found.group() <= "\udfff":
        advice = "the text was decoded wrongly; remove it or write the character it stands for"
    else:
        advice = f"only tab, newline and carriage return are ({_STORAGE_REASON}): remove it"
    raise _policy_error(
        source, line, "", f"{character} at column {column} is not allowed in a policy; {advice}"
    )


def _utf8_size(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def _size_error(source: str, size: str) -> PolicyError:
    return _policy_error(
        source, None, "",
        f"{size}, more than the {MAX_POLICY_BYTES:,} a policy may have (1,000 actions take about "
        f"200 KB); shorten it",
    )


class _Composer(yaml.composer.Composer):
    """PyYAML's composer, bounded: depth and the size of the expanded document are counted while
    the node graph is built, so a hostile document is refused before anything walks it.

    Aliases share nodes, so the graph stays as small as the text while the tree it stands for can
    be exponentially larger ("billion laughs"); every later walk (the value check, the plain copy,
    hashing) sees the tree. So the running total charges each node once as it is composed and
    each alias as the whole of what it names (remembered per finished list and mapping, so an
    alias costs one lookup); the total is the size of the expanded tree, or more when merge keys
    copy only part of what their aliases name. Merge keys are resolved here, once per mapping
    (the first mapping in ``<<: [*a, *b]`` wins, as YAML specifies, and the mapping's own keys win
    over every merged one): the copying is bounded by the charge of the aliases it copies from.
    The number of own pairs is remembered for the duplicate-key check.
    """

    def __init__(self) -> None:
        super().__init__()
        self.levels = 0  # lists and mappings open above the node being composed
        self.total = 0  # nodes of the expanded document composed so far
        self.through_aliases = 0  # the part of the total that aliases brought
        self.sizes: dict[int, int] = {}  # id(finished collection) -> its nodes once expanded
        self.heights: dict[int, int] = {}  # id(finished collection) -> collection levels, its own included
        self.own_pairs: dict[int, int] = {}  # id(mapping) -> pairs written in it (the others are merged)

    def charge(self, nodes: int, mark: Any, *, alias: bool = False) -> None:
        self.total += nodes
        if alias:
            self.through_aliases += nodes
        if self.total <= MAX_POLICY_NODES:
            return
        if self.through_aliases:
            message = (
                f"the document expands to more than {MAX_POLICY_NODES:,} nodes by here, counting each "
                f"alias as the whole of what it names (merge keys included); a policy of 1,000 actions "
                f"has about 25,000: write repeated parts out instead of nesting aliases inside aliases"
            )
        else:
            message = (
                f"the document has more than {MAX_POLICY_NODES:,} nodes (scalars, lists and mappings) "
                f"by here; a policy of 1,000 actions has about 25,000: shorten it"
            )
        raise _Refusal(mark.line + 1, message)

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        if not self.check_event(yaml.AliasEvent):
            return super().compose_node(parent, index)
        event = self.get_event()
        node = self.anchors.get(event.anchor)
        if node is None:
            raise yaml.composer.ComposerError(
                None, None, f"found undefined alias {event.anchor!r}", event.start_mark
            )
        # A collection still open (an alias inside its own anchor) has no size or height yet;
        # the value check refuses such recursive structures, naming their path.
        if self.levels + self.heights.get(id(node), 0) > MAX_POLICY_DEPTH:
            raise _Refusal(event.start_mark.line + 1, _too_deep())
        self.charge(self.sizes.get(id(node), 1), event.start_mark, alias=True)
        return node

    def compose_scalar_node(self, anchor: str | None) -> ScalarNode:
        node = super().compose_scalar_node(anchor)
        self.charge(1, node.start_mark)
        return node

    def compose_sequence_node(self, anchor: str | None) -> SequenceNode:
        self.enter()
        node = super().compose_sequence_node(anchor)
        self.levels -= 1
        sizes, heights = self.sizes, self.heights
        self.sizes[id(node)] = 1 + sum(sizes.get(id(child), 1) for child in node.value)
        self.heights[id(node)] = 1 + max((heights.get(id(child), 0) for child in node.value), default=0)
        return node

    def compose_mapping_node(self, anchor: str | None) -> MappingNode:
        self.enter()
        node = super().compose_mapping_node(anchor)
        self.levels -= 1
        self.flatten(node)
        sizes, heights = self.sizes, self.heights
        self.sizes[id(node)] = 1 + sum(
            sizes.get(id(key), 1) + sizes.get(id(value), 1) for key, value in node.value
        )
        self.heights[id(node)] = 1 + max(
            (max(heights.get(id(key), 0), heights.get(id(value), 0)) for key, value in node.value), default=0
        )
        return node

    def enter(self) -> None:
        mark = self.peek_event().start_mark
        self.levels += 1
        if self.levels > MAX_POLICY_DEPTH:
            raise _Refusal(mark.line + 1, _too_deep())
        self.charge(1, mark)

    def flatten(self, node: MappingNode) -> None:
        """Resolve the merge keys of a just-composed mapping (its merge sources are finished)."""
        own: list[tuple[Node, Node]] = []
        merged: dict[Any, tuple[Node, Node]] = {}
        for key_node, value_node in node.value:
            if key_node.tag != _MERGE_TAG:
                if key_node.tag == _VALUE_TAG:
                    key_node.tag = _STR_TAG  # as PyYAML's flatten_mapping does
                own.append((key_node, value_node))
                continue
            if isinstance(value_node, MappingNode):
                sources = [value_node]
            elif isinstance(value_node, SequenceNode):
                sources = value_node.value
            else:
                raise ConstructorError(
                    "while constructing a mapping", node.start_mark,
                    f"expected a mapping or list of mappings for merging, but found {value_node.id}",
                    value_node.start_mark,
                )
            for source in sources:
                if not isinstance(source, MappingNode):
                    raise ConstructorError(
                        "while constructing a mapping", node.start_mark,
                        f"expected a mapping for merging, but found {source.id}", source.start_mark,
                    )
                if id(source) not in self.sizes:
                    raise _Refusal(
                        _line(key_node),
                        "a merge key ('<<') refers to the mapping that contains it; recursive "
                        "structures are not allowed",
                    )
                for pair in source.value:  # already flattened: no merge keys left in it
                    merged.setdefault(_key_identity(pair[0]), pair)
        if len(own) != len(node.value):
            node.value = [*merged.values(), *own]
        self.own_pairs[id(node)] = len(own)


def _key_identity(node: Node) -> Any:
    """What makes two merged keys the same key: tag and text for a scalar, the node otherwise."""
    return (node.tag, node.value) if isinstance(node, ScalarNode) else id(node)


def _too_deep() -> str:
    return (
        f"lists and mappings are nested more than {MAX_POLICY_DEPTH} levels deep here (counting "
        f"aliases where they are used); a policy needs about 7: flatten the structure"
    )


class _DuplicateKey(ConstructorError):
    """A key given twice in one mapping. PyYAML keeps the last silently; a policy may not."""

    def __init__(self, *args: Any, note: str) -> None:
        super().__init__(*args)
        self.note = note


class _Resolver(yaml.resolver.Resolver):
    """YAML 1.1 resolution, plus YAML 1.2's ``0o17`` octal, so that it is refused as an int
    spelling instead of silently becoming the string '0o17' for a reader who meant 15."""


_Resolver.add_implicit_resolver("tag:yaml.org,2002:int", re.compile(r"^[-+]?0o[0-7_]+$"), list("-+0"))


class _Constructor(yaml.constructor.SafeConstructor):
    """SafeConstructor that refuses duplicate keys, records lines and refuses what a policy may
    not hold; see the module docstring. Merge keys were resolved by :class:`_Composer`."""

    own_pairs: dict[int, int]

    def flatten_mapping(self, node: MappingNode) -> None:
        """Nothing left to do: the composer resolved every merge key, within its budget."""


class _PyLoader(
    yaml.reader.Reader, yaml.scanner.Scanner, yaml.parser.Parser, _Composer, _Constructor, _Resolver
):
    """The pure-Python loader (PyYAML without libyaml)."""

    def __init__(self, stream: str) -> None:
        yaml.reader.Reader.__init__(self, stream)
        yaml.scanner.Scanner.__init__(self)
        yaml.parser.Parser.__init__(self)
        _Composer.__init__(self)
        _Constructor.__init__(self)
        _Resolver.__init__(self)


_CLoader: type | None = None
if _HAVE_LIBYAML:
    from yaml.cyaml import CParser

    class _CLoader(_Composer, CParser, _Constructor, _Resolver):  # type: ignore[no-redef]
        """libyaml's parser for the events; the bounded Python composer above builds the nodes."""

        def __init__(self, stream: str) -> None:
            CParser.__init__(self, stream)
            _Composer.__init__(self)
            _Constructor.__init__(self)
            _Resolver.__init__(self)


def _construct_map(loader: _Constructor, node: MappingNode) -> Iterator[_YamlMap]:
    data = _YamlMap()
    data.line = _line(node)
    data.key_lines = {}
    yield data  # yielded empty first so aliases (even recursive ones) can refer to it
    if not isinstance(node, MappingNode):
        raise ConstructorError(None, None, f"expected a mapping, but found {node.id}", node.start_mark)
    # Merged pairs (<<: *base) come first, so the mapping's own keys override them. Only the own
    # keys count for duplicates.
    first_own = len(node.value) - loader.own_pairs.get(id(node), len(node.value))
    own_lines: dict[str, int] = {}
    for position, (key_node, value_node) in enumerate(node.value):
        key = loader.construct_object(key_node, deep=False)
        try:
            hash(key)
        except TypeError:
            raise ConstructorError(
                "while constructing a mapping", node.start_mark, "found unhashable key", key_node.start_mark
            ) from None
        if position >= first_own and isinstance(key, str):
            if key in own_lines:
                raise _DuplicateKey(
                    None, None, f"duplicate key {key!r}", key_node.start_mark,
                    note=f"first defined on line {own_lines[key]}",
                )
            own_lines[key] = _line(key_node)
        data[key] = loader.construct_object(value_node, deep=False)
        data.key_lines[key] = _line(key_node)


def _construct_seq(loader: _Constructor, node: SequenceNode) -> Iterator[_YamlList]:
    data = _YamlList()
    data.line = _line(node)
    data.item_lines = [_line(child) for child in node.value]
    yield data
    data.extend(loader.construct_object(child, deep=False) for child in node.value)


def _construct_str(loader: _Constructor, node: Node) -> str | _Refused:
    """A string, or a refusal when an escape put a control character or a lone surrogate in it."""
    value = loader.construct_scalar(node)
    found = _FORBIDDEN_IN_STRING.search(value)
    if found is None:
        return value
    character = _describe_character(found.group())
    if found.group() >= "\ud800":
        problem = (
            f"contains {character}, written as an escape; it cannot be stored as UTF-8: write the "
            f"character itself, or its \\U00XXXXXX escape"
        )
    else:
        problem = (
            f"contains {character}, written as an escape; strings may hold tab, newline and carriage "
            f"return but no other control character ({_STORAGE_REASON}): remove the escape"
        )
    shown = _shown(value)
    return _Refused("a string with a control character", shown, _line(node),
                    message=f"the string {shown} {problem}", key_message=f"the key {shown} {problem}")


#: The one integer spelling a policy reads as an int: decimal, with an optional sign.
_DECIMAL_INT = re.compile(r"[-+]?(?:0|[1-9][0-9]*)\Z")


def _construct_int(loader: _Constructor, node: Node) -> int | _Refused:
    """A plain decimal int; any other spelling YAML reads as an int is refused, saying its value."""
    text = loader.construct_scalar(node)
    if _DECIMAL_INT.match(text):
        try:
            return int(text)
        except ValueError as exc:  # more digits than Python converts (sys.get_int_max_str_digits)
            raise ConstructorError(
                None, None, f"{text[:20]}... is not a usable int ({exc})", node.start_mark
            ) from None
    body = text.lstrip("+-")
    if ":" in body:
        kind = "a sexagesimal (base 60) integer"
    elif body.startswith("0b"):
        kind = "a binary integer"
    elif body.startswith("0x"):
        kind = "a hexadecimal integer"
    elif body.startswith("0o"):
        kind = "an octal integer"
    elif body.startswith("0") and len(body) > 1:
        kind = "an octal integer (a leading 0 means octal in YAML 1.1)"
    elif "_" in body:
        kind = "an integer with '_' separators"
    else:
        kind = "an integer that is not plain decimal"
    value = _yaml_int_value(text)
    quoted = '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if value is None:
        message = (
            f"{text} is tagged or spelled as {kind}, which YAML cannot read as a number; write a plain "
            f"decimal integer, or quote it ({quoted}) to make it a string"
        )
    else:
        message = (
            f"{text} is {kind}, which YAML reads as {value}; a policy reads only plain decimal integers "
            f"as ints: write {value}, or quote it ({quoted}) to keep it as a string"
        )
    return _Refused(kind, text, _line(node), message=message)


def _yaml_int_value(text: str) -> int | None:
    """What YAML 1.1 (or 1.2, for ``0o``) would make of an int spelling; None if nothing."""
    sign = -1 if text.startswith("-") else 1
    body = text.lstrip("+-").replace("_", "")
    try:
        if body.startswith(("0b", "0x", "0o")):
            return sign * int(body[2:], {"b": 2, "x": 16, "o": 8}[body[1]])
        if ":" in body:
            value = 0
            for part in body.split(":"):
                value = value * 60 + int(part)
            return sign * value
        if body.startswith("0") and len(body) > 1:
            return sign * int(body, 8)
        return sign * int(body)
    except (ValueError, KeyError, IndexError):
        return None


def _refuse_scalar(
    what: str, check: Callable[[_Constructor, Node], Any] | None = None
) -> Callable[[_Constructor, Node], _Refused]:
    """A constructor that returns a :class:`_Refused` marker instead of the value."""
    noun = "date" if what == "a timestamp" else what[2:]

    def construct(loader: _Constructor, node: Node) -> _Refused:
        if check is not None:
            # Build the real value first: a malformed one (2026-99-99) is a YAML error,
            # reported as such, before it is a policy error.
            try:
                check(loader, node)
            except (ValueError, OverflowError) as exc:
                raise ConstructorError(
                    None, None, f"{node.value!r} is not a valid {noun} ({exc})", node.start_mark
                ) from None
        text = node.value if isinstance(node.value, str) else ""
        kind = what
        if kind == "a timestamp" and re.fullmatch(r"\d{4}-\d\d?-\d\d?", text):
            kind = "a date"
        if kind == "a !!binary value":
            text = ""  # base64 noise helps nobody
        return _Refused(kind, text, _line(node))

    return construct


def _refuse_collection(what: str) -> Callable[[_Constructor, Node], _Refused]:
    def construct(loader: _Constructor, node: Node) -> _Refused:
        return _Refused(what, "", _line(node))

    return construct


_Constructor.add_constructor("tag:yaml.org,2002:map", _construct_map)
_Constructor.add_constructor("tag:yaml.org,2002:seq", _construct_seq)
_Constructor.add_constructor(_STR_TAG, _construct_str)
_Constructor.add_constructor("tag:yaml.org,2002:int", _construct_int)
_Constructor.add_constructor("tag:yaml.org,2002:float", _refuse_scalar("a float"))
_Constructor.add_constructor(
    "tag:yaml.org,2002:timestamp", _refuse_scalar("a timestamp", yaml.SafeLoader.construct_yaml_timestamp)
)
_Constructor.add_constructor(
    "tag:yaml.org,2002:binary", _refuse_scalar("a !!binary value", yaml.SafeLoader.construct_yaml_binary)
)
_Constructor.add_constructor("tag:yaml.org,2002:set", _refuse_collection("a !!set"))
_Constructor.add_constructor("tag:yaml.org,2002:omap", _refuse_collection("an !!omap"))
_Constructor.add_constructor("tag:yaml.org,2002:pairs", _refuse_collection("a !!pairs"))


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """``<problem> on line L, column C`` from a PyYAML error (its own str() spans several lines)."""
    if isinstance(exc, yaml.MarkedYAMLError):
        if exc.context and exc.problem:
            # PyYAML splits one sentence in two: "while scanning a simple key" / "could not
            # find expected ':'", or "expected a single document" / "but found another document".
            if exc.problem.startswith("but "):
                parts = [f"{exc.context}, {exc.problem}"]
            else:
                parts = [f"{exc.problem} ({exc.context})"]
        else:
            parts = [exc.problem or exc.context or "malformed document"]
        mark = exc.problem_mark or exc.context_mark
        if mark is not None:
            parts.append(f"on line {mark.line + 1}, column {mark.column + 1}")
        if isinstance(exc, _DuplicateKey):
            parts.append(f"({exc.note})")
        return " ".join(parts)
    return str(exc).replace("\n", " ")


def _policy_error(source: str, line: int | None, location: str, message: str) -> PolicyError:
    """Build the one message shape: ``<source>[, line N]: [<location>: ]<message>``."""
    prefix = source if line is None else f"{source}, line {line}"
    text = f"{prefix}: {location}: {message}" if location else f"{prefix}: {message}"
    error = PolicyError(text)
    error.source = source  # type: ignore[attr-defined]
    error.line = line  # type: ignore[attr-defined]
    error.location = location  # type: ignore[attr-defined]
    return error


def _load_yaml(text: str, source: str) -> Any:
    """The loaded document; every failure, the reader's included, is a PolicyError."""
    _check_text(text, source)
    loader_class = _CLoader if _USE_LIBYAML and _CLoader is not None else _PyLoader
    loader = None
    try:
        loader = loader_class(text)
        return loader.get_single_data()
    except _Refusal as exc:
        raise _policy_error(source, exc.line, "", exc.message) from None
    except yaml.YAMLError as exc:
        raise _policy_error(source, None, "", f"not valid YAML: {_yaml_problem(exc)}") from None
    except (ValueError, OverflowError) as exc:  # a scalar constructor outside the wrapped ones
        raise _policy_error(source, None, "", f"not valid YAML: {exc}") from None
    except RecursionError:
        raise _policy_error(source, None, "", "not valid YAML: the document is nested too deeply") from None
    finally:
        if loader is not None:
            loader.dispose()


def _type_name(value: Any) -> str:
    if isinstance(value, _YamlMap):
        return "dict"
    if isinstance(value, _YamlList):
        return "list"
    if isinstance(value, _Refused):
        return value.what
    return type(value).__name__


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_GRANT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\Z")


def _join(path: str, key: Any) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    if _IDENTIFIER.match(key):
        return f"{path}.{key}" if path else key
    return f"{path}[{key!r}]"


def _plain(value: Any) -> Any:
    """A plain-dict/list copy of the loaded tree (what the hash and the public fields hold)."""
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value


# --------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------


@dataclass
class _Document:
    """What a valid document says, as the reader found it."""

    schema: str
    entries: dict[str, ActionEntry] = field(default_factory=dict)
    raw_actions: Any = None
    environment: str | None = None
    mode: str = "enforce"
    version: str | None = None
    controls: dict[str, ControlEntry] = field(default_factory=dict)
    raw_controls: Any = None
    authority: Authority | None = None


class _Reader:
    """Walks one loaded document, raising PolicyError at the first problem, building the entries."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.schema = ""
        self.version = 0
        self.registry: dict[str, ControlEntry] = {}

    def fail(self, line: int | None, location: str, message: str) -> NoReturn:
        """Raise the PolicyError for ``message`` at ``line`` / ``location`` of this source."""
        raise _policy_error(self.source, line, location, message)

    # -- the whole document ------------------------------------------------------------------

    def check_values(self, value: Any, path: str, line: int | None, open_containers: set[int]) -> None:
        """Refuse anything but str, int, bool, null, lists and string-keyed maps, anywhere."""
        where = path or "top level"
        if isinstance(value, _Refused):
            if value.message:
                self.fail(value.line, where, value.message)
            hint = _REFUSED_HINTS.get(value.what, "")
            self.fail(
                value.line, where,
                f"{value.describe()} is not allowed in a policy (the whole document is hashed, "
                f"and only strings, ints, booleans, null, lists and mappings have one canonical form)"
                + (f"; {hint}" if hint else ""),
            )
        if isinstance(value, (dict, list)):
            if id(value) in open_containers:
                self.fail(line, where, "a YAML alias refers to a mapping or list that contains it; "
                                       "recursive structures are not allowed")
            open_containers.add(id(value))
            if isinstance(value, dict):
                lines = getattr(value, "key_lines", {})
                for key, item in value.items():
                    key_line = lines.get(key, line)
                    if not isinstance(key, str):
                        if isinstance(key, _Refused):
                            if key.key_message:
                                self.fail(key_line, where, key.key_message)
                            shown = f"{key.describe()} as a key"
                        else:
                            shown = f"the {_type_name(key)} key {key!r}"
                        if isinstance(key, bool):
                            shown += " (YAML reads unquoted yes/no/on/off/true/false as booleans)"
                        self.fail(key_line, where, f"mapping keys must be strings, found {shown}; quote it")
                    if not key.isascii():
                        self.check_name(key, key_line, where)
                    self.check_values(item, _join(path, key), key_line, open_containers)
            else:
                lines = getattr(value, "item_lines", [])
                for index, item in enumerate(value):
                    item_line = lines[index] if index < len(lines) else line
                    self.check_values(item, _join(path, index), item_line, open_containers)
            open_containers.discard(id(value))
        elif not (value is None or isinstance(value, (str, int))):  # bool is an int
            self.fail(line, where, f"{_type_name(value)} values are not allowed in a policy")

    def check_name(self, key: str, line: int | None, where: str) -> None:
        """Refuse a key holding a format character (Cf: bidi controls, zero-width characters, BOM).

        Keys become action names, condition names and database columns' contents, shown to the
        people who read policies and receipts; ``stripe.refund\u202e`` would render as something
        it is not.
        """
        for char in key:
            if unicodedata.category(char) == "Cf":
                what = "the action name" if where == "actions" else "the key"
                self.fail(
                    line, where,
                    f"{what} {_shown(key)} contains {_describe_character(char)}, which is invisible or "
                    f"reorders the text around it, so the name would display differently from what it "
                    f"is; remove it",
                )

    def read(self, document: Any) -> _Document:
        """Validate the loaded document; return what it says, ready to build the Policy from."""
        if document is None:
            self.fail(None, "", f"the policy is empty; it needs 'schema: {_NEWEST_SUPPORTED}' and 'actions:'")
        if not isinstance(document, dict):
            self.fail(
                getattr(document, "line", None), "top level",
                f"a policy must be a mapping with 'schema' and 'actions', got {_type_name(document)}",
            )
        self.check_values(document, "", document.line, set())
        self.read_schema(document)
        self.check_keys(document, _TOP_KEYS, document.line, "top level")
        read = _Document(schema=self.schema)
        if "environment" in document:
            read.environment = self.read_label(document, "environment", "top level")
        if "mode" in document:
            read.mode = self.read_mode(document["mode"], document.key_lines["mode"])
        if "version" in document:
            read.version = self.read_label(document, "version", "top level")
        if "controls" in document:
            read.raw_controls = _plain(document["controls"])
            read.controls = self.read_registry(document["controls"], document.key_lines["controls"])
        self.registry = read.controls
        if "authority" in document:
            read.authority = self.read_authority(document["authority"], document.key_lines["authority"])
        actions = document.get("actions")
        actions_line = document.key_lines.get("actions")
        if not isinstance(actions, dict):
            missing = "" if "actions" in document else " (the key is missing)"
            self.fail(
                actions_line, "top level",
                f"'actions' must be a mapping of action name to entry, got {_type_name(actions)}{missing}",
            )
        for name, entry in actions.items():
            read.entries[name] = self.read_entry(name, entry, actions.key_lines[name])
        read.raw_actions = _plain(actions)
        return read

    def read_schema(self, document: _YamlMap) -> None:
        """Accept a known schema (v1..v8); refuse anything else, listing them."""
        schema = document.get("schema")
        line = document.key_lines.get("schema", document.line)
        if schema in SUPPORTED_SCHEMAS:
            self.schema = schema
            self.version = _SCHEMA_VERSION[schema]
            return
        self.fail(
            line if "schema" in document else None, "top level",
            f"unknown policy schema {schema!r}, expected one of {', '.join(SUPPORTED_SCHEMAS)}",
        )

    def check_keys(self, mapping: _YamlMap, known: Mapping[str, int], line: int, location: str) -> None:
        """Closed key set: unknown keys first (listing the allowed ones), then later-schema keys."""
        if "mode" in mapping and "mode" not in known:
            self.fail(
                mapping.key_lines.get("mode", line), location,
                "'mode' is only allowed at the top level of the document: it applies to every action of "
                "the process at once, and a policy enforced for some actions and only observed for others "
                "is exactly the half-enforced configuration nobody notices; move it to the top level",
            )
        if "redact" in mapping and "redact" not in known:
            self.fail(
                mapping.key_lines.get("redact", line), location,
                "'redact' is not part of the format: redaction of labelled data was cut, and receipts keep "
                "the arguments as the hash covers them; remove it (a 'data' label only names the data class)",
            )
        unknown = [key for key in mapping if key not in known]
        if unknown:
            listed = ", ".join(repr(key) for key in unknown)
            self.fail(
                mapping.key_lines.get(unknown[0], line), location,
                f"unknown key(s) {listed}; allowed: {', '.join(sorted(known))}",
            )
        for key in mapping:  # document order: name the first one the author will see
            needed = known[key]
            if needed > self.version:
                self.fail(mapping.key_lines.get(key, line), location, self.needs_schema(repr(key), needed))

    def needs_schema(self, what: str, needed: int) -> str:
        """The sentence for a feature of schema v``needed`` found in an older document."""
        return (
            f"{what} needs 'schema: ctrlrun.policy/v{needed}'; this document declares {self.schema!r}, so "
            f"change its schema line to 'schema: ctrlrun.policy/v{needed}' (a reader of {self.schema!r} would "
            f"not know what to do with it, so it is refused rather than ignored)"
        )

    def not_built(self, line: int | None, location: str, feature: str) -> NoReturn:
        """Refuse a feature this version reads but cannot enforce yet (see ``_NOT_BUILT``)."""
        self.fail(
            line, location,
            f"{_NOT_BUILT[feature]} is valid {self.schema!r}, but this version of ctrlrun does not enforce it "
            f"yet, and a policy is never half-applied: the whole document is refused. Remove it (or upgrade "
            f"ctrlrun when it is built)",
        )

    # -- top-level settings (v3, v4) ---------------------------------------------------------

    def read_label(self, mapping: _YamlMap, key: str, where: str) -> str:
        """A non-empty one-line string (``environment``, ``version``), stripped."""
        value, line = mapping[key], mapping.key_lines[key]
        if not isinstance(value, str) or not value.strip():
            got = "a blank string" if isinstance(value, str) else _type_name(value)
            self.fail(line, where, f"'{key}' must be a non-empty string, got {got}")
        value = value.strip()
        self.check_one_line(value, line, where, f"'{key}'")
        return value

    def check_one_line(self, value: str, line: int, where: str, what: str) -> None:
        for char in value:
            if char in "\n\r\t\u2028\u2029" or unicodedata.category(char) in ("Cc", "Cf"):
                self.fail(
                    line, where,
                    f"{what} {_shown(value)} contains {_describe_character(char)}; it is shown on one line in "
                    f"receipts and the console, so it must be visible text: remove it",
                )

    def read_mode(self, value: Any, line: int) -> str:
        if isinstance(value, str) and value in _MODES:
            return value
        hint = ""
        if isinstance(value, bool):
            hint = " (YAML reads unquoted on/off/yes/no/true/false as booleans: write 'observe' or 'enforce')"
        self.fail(line, "top level", f"'mode' must be 'enforce' or 'observe', got {value!r}{hint}")

    def read_registry(self, value: Any, line: int) -> dict[str, ControlEntry]:
        """The ``controls:`` registry: id -> {title, source?, approver_role? (v6)}."""
        where = "controls"
        if not isinstance(value, dict):
            self.fail(line, where, f"'controls' must be a mapping of control id to {{title: ...}}, got "
                                   f"{_type_name(value)}")
        registry: dict[str, ControlEntry] = {}
        for ident, body in value.items():
            id_line = value.key_lines.get(ident, line)
            this = f"control {_shown(ident)}"
            if not ident or len(ident) > MAX_CONTROL_ID:
                self.fail(id_line, where, f"control ids must be 1 to {MAX_CONTROL_ID} characters, got {len(ident)}")
            self.check_one_line(ident, id_line, where, "the control id")
            if not isinstance(body, dict):
                self.fail(id_line, this, f"a control must be a mapping with 'title' (and optionally 'source'), "
                                         f"got {_type_name(body)}")
            self.check_keys(body, _CONTROL_KEYS, id_line, this)
            if "title" not in body:
                self.fail(id_line, this, "a control needs a 'title' (what it requires, as auditors know it)")
            title = self.read_label(body, "title", this)
            source = self.read_label(body, "source", this) if "source" in body else None
            role = None
            if "approver_role" in body:
                raw = body["approver_role"]
                if isinstance(raw, str) and raw != raw.strip():
                    self.fail(body.key_lines["approver_role"], this,
                              f"'approver_role' {raw!r} has leading or trailing whitespace; roles are matched "
                              f"exactly, so write it without")
                role = self.read_label(body, "approver_role", this)
                self.not_built(body.key_lines["approver_role"], this, "approver_role")
            registry[ident] = ControlEntry(ident, title, source, role)
        return registry

    def read_citations(self, value: Any, line: int, where: str) -> list[str]:
        """A ``controls: [id, ...]`` citation on an entry or a rule: ids declared in the registry."""
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            self.fail(line, where, f"'controls' must be a list of control ids, got {_type_name(value)}")
        declared = self.registry
        for item in value:
            if item not in declared:
                listed = ", ".join(repr(ident) for ident in declared) or "none (there is no 'controls:' registry)"
                self.fail(line, where, f"cites the control {_shown(item)}, which the 'controls:' registry does "
                                       f"not declare; declared: {listed}")
        if len(set(value)) != len(value):
            self.fail(line, where, "'controls' cites the same control twice")
        return value

    def in_registry_order(self, *citations: list[str]) -> tuple[str, ...]:
        cited = {ident for group in citations for ident in group}
        return tuple(ident for ident in self.registry if ident in cited)

    # -- authority (v3; read and validated, not enforced yet) ---------------------------------

    def read_authority(self, value: Any, line: int) -> Authority:
        """The ``authority:`` section (v3): grants, validated in full, ready to evaluate."""
        where = "authority"
        if not isinstance(value, dict):
            self.fail(line, where, f"'authority' must be a mapping with 'grants', got {_type_name(value)}")
        self.check_keys(value, _AUTHORITY_KEYS, line, where)
        depth = value.get("max_delegation_depth", 3)
        if not _is_int(depth) or depth < 0:
            self.fail(value.key_lines.get("max_delegation_depth", line), where,
                      f"'max_delegation_depth' must be an int of 0 or more, got {depth!r}")
        if "grants" not in value:
            self.fail(line, where, "'authority' needs 'grants' (a list; 'grants: []' permits nothing)")
        grants = value["grants"]
        if not isinstance(grants, list):
            self.fail(value.key_lines["grants"], where, f"'grants' must be a list of grants, got {_type_name(grants)}")
        read: dict[str, Grant] = {}
        for index, grant in enumerate(grants):
            built = self.read_grant(grant, grants.item_lines[index], f"authority grants[{index}]", read)
            read[built.id] = built
        envelopes = value.get("break_glass")
        if envelopes is not None:
            if not isinstance(envelopes, dict):
                self.fail(value.key_lines["break_glass"], where,
                          f"'break_glass' must be a mapping of envelope id to grant, got {_type_name(envelopes)}")
            for ident, body in envelopes.items():
                if isinstance(body, dict):  # the v7 gates apply inside envelopes too
                    for key in ("tasks", "budgets"):
                        if key in body and self.version < 7:
                            self.fail(body.key_lines[key], f"authority break_glass {ident!r}",
                                      self.needs_schema(repr(key), 7))
            self.not_built(value.key_lines["break_glass"], where, "break_glass")
        return Authority(types.MappingProxyType(read), depth)

    def read_grant(self, grant: Any, line: int, where: str, seen: Mapping[str, Grant]) -> Grant:
        if not isinstance(grant, dict):
            self.fail(line, where, f"a grant must be a mapping, got {_type_name(grant)}")
        self.check_keys(grant, _GRANT_KEYS, line, where)
        ident = grant.get("id")
        if not isinstance(ident, str) or not _GRANT_ID.match(ident) or ident.startswith("dlg_"):
            self.fail(grant.key_lines.get("id", line), where,
                      f"a grant needs an 'id' of letters, digits, '.', '_' and '-' (starting with a letter or "
                      f"digit, not 'dlg_', which delegations use), got {ident!r}")
        if ident in seen:
            self.fail(grant.key_lines["id"], where, f"grant id {ident!r} is used twice")
        where = f"authority grant {ident!r}"
        subject = grant.get("subject")
        subject_line = grant.key_lines.get("subject", line)
        if not isinstance(subject, dict) or not subject or set(subject) - {"agent", "user"}:
            self.fail(subject_line, where, "a grant needs a 'subject' mapping with 'agent' and/or 'user'")
        for key, pattern in subject.items():
            problem = validate_pattern(pattern, "", subject=True)
            if problem:
                self.fail(subject_line, where, f"subject {key}: {problem}")
        patterns: dict[str, tuple[str, ...] | None] = {}
        for key, separator in (("actions", "."), ("resources", ":"), ("environments", None), ("tasks", ":")):
            if key not in grant and key != "actions":
                patterns[key] = None
                continue
            items = grant.get(key)
            key_line = grant.key_lines.get(key, line)
            if not isinstance(items, list) or not items or not all(isinstance(i, str) and i for i in items):
                self.fail(key_line, where, f"'{key}' must be a non-empty list of non-empty strings, got {items!r}")
            for item in items:
                if separator is not None:
                    problem = validate_pattern(item, separator)
                    if problem:
                        self.fail(key_line, where, f"{key}: {problem}")
                else:
                    self.check_one_line(item, key_line, where, "an environment")
            patterns[key] = tuple(items)
        constraints: tuple[Condition, ...] | None = None
        if "constraints" in grant:
            raw = grant["constraints"]
            if not isinstance(raw, dict) or not raw:
                self.fail(grant.key_lines["constraints"], where, "'constraints' must be a non-empty mapping")
            for key in raw:
                if _split_condition(key)[0] == _DERIVED_SUBJECT:
                    self.fail(raw.key_lines[key], where,
                              f"constraint {key!r}: '{_DERIVED_SUBJECT}' belongs to the policy's rules, not "
                              f"to authority constraints")
            constraints = tuple(self.read_condition(key, operand, raw.key_lines[key], where)
                                for key, operand in raw.items())
        delegable = grant.get("delegable", False)
        if not isinstance(delegable, bool):
            self.fail(grant.key_lines["delegable"], where, "'delegable' must be true or false")
        expires_at = None
        if "expires_at" in grant:
            expires_at = self.read_instant(grant["expires_at"], grant.key_lines["expires_at"], where)
        if delegable and expires_at is None:
            self.fail(grant.key_lines["delegable"], where, "a delegable grant needs 'expires_at'")
        budgets = None
        if "budgets" in grant:
            budgets = self.read_budgets(grant["budgets"], grant.key_lines["budgets"], where)
        return Grant(ident, subject.get("agent"), subject.get("user"), patterns["actions"] or (),
                     patterns["resources"], constraints, patterns["environments"], expires_at, delegable,
                     patterns["tasks"], budgets)

    def read_instant(self, value: Any, line: int, where: str) -> dt.datetime:
        """``expires_at``: an ISO-8601 time with an offset (quoted; an unquoted one is refused as a timestamp)."""
        try:
            moment = dt.datetime.fromisoformat(value) if isinstance(value, str) else None
        except ValueError:
            moment = None
        if moment is None or moment.tzinfo is None or moment.utcoffset() is None:
            self.fail(line, where, f"'expires_at' must be an ISO-8601 time with an offset, quoted "
                                   f"('2026-12-31T23:59:59Z'), got {value!r}")
        return moment.astimezone(dt.timezone.utc)

    def read_budgets(self, value: Any, line: int, where: str) -> tuple[Budget, ...]:
        if not isinstance(value, list) or not value:
            self.fail(line, where, f"'budgets' must be a non-empty list of {{metric, limit, window}}, got "
                                   f"{_type_name(value)}")
        budgets = []
        for index, item in enumerate(value):
            item_line = value.item_lines[index]
            here = f"{where} budgets[{index}]"
            if not isinstance(item, dict):
                self.fail(item_line, here, f"a budget must be a mapping of metric, limit and window, got "
                                           f"{_type_name(item)}")
            self.check_keys(item, {**_BUDGET_KEYS, **_BUDGET_OPTIONAL}, item_line, here)
            missing = [key for key in _BUDGET_KEYS if key not in item]
            if missing:
                self.fail(item_line, here, f"a budget needs {', '.join(repr(k) for k in missing)}")
            metric, limit = item["metric"], item["limit"]
            if not isinstance(metric, str) or not (metric == "count" or metric.isidentifier()):
                self.fail(item.key_lines["metric"], here, f"'metric' is 'count' or the name of an int argument, "
                                                          f"got {metric!r}")
            if not _is_int(limit) or limit < 0 or limit > MAX_AMOUNT:
                self.fail(item.key_lines["limit"], here, f"'limit' must be an int of 0 or more, at most "
                                                         f"{MAX_AMOUNT} (2**63 - 1), got {limit!r}")
            try:
                window = parse_window(item["window"])
            except ValueError as exc:
                self.fail(item.key_lines["window"], here, str(exc))
            currency = item.get("currency")
            if currency is not None:
                line_of = item.key_lines["currency"]
                if not isinstance(currency, str) or not _CURRENCY.fullmatch(currency):
                    self.fail(line_of, here, f"'currency' must be an ISO 4217 code of three capital letters (EUR, "
                                             f"USD, JPY), got {currency!r}: the budget's amounts are then minor "
                                             f"units of it (cents), shown as money")
                if metric == "count":
                    self.fail(line_of, here, "a count budget counts calls, not money: remove 'currency', or "
                                             "budget an amount argument")
            budgets.append(Budget(metric, limit, window, currency))
        return tuple(budgets)

    # -- one action --------------------------------------------------------------------------

    def read_entry(self, name: str, entry: Any, line: int) -> ActionEntry:
        """One ``actions`` item: exactly one of decision/rules, plus optional templates and options."""
        if not name:
            self.fail(line, "actions", "action names must be non-empty strings")
        where = f"action {name!r}"
        if name == _POLICY_CHANGE_ACTION:
            if self.version < 6:
                self.fail(line, where, self.needs_schema(f"the reserved action {name!r}", 6))
            self.not_built(line, where, "policy_change")
        if not isinstance(entry, dict):
            self.fail(
                line, where,
                f"an entry must be a mapping with 'decision' or 'rules', got {_type_name(entry)}",
            )
        self.check_keys(entry, _ENTRY_KEYS, line, where)
        if ("decision" in entry) == ("rules" in entry):
            self.fail(line, where, "entry must have exactly one of 'decision' or 'rules'")

        cited: list[str] = []
        if "controls" in entry:
            cited = self.read_citations(entry["controls"], entry.key_lines["controls"], where)
        decision: Decision | None = None
        rules: tuple[Rule, ...] = ()
        if "decision" in entry:
            decision = self.read_decision(entry["decision"], entry.key_lines["decision"], where)
        else:
            rules = self.read_rules(entry["rules"], entry.key_lines["rules"], where, cited)

        effect = self.read_template(entry, "effect", where) if "effect" in entry else None
        resource = self.read_template(entry, "resource", where) if "resource" in entry else None
        mcp = self.read_mcp(entry["mcp"], entry.key_lines["mcp"], where) if "mcp" in entry else None
        data = self.read_data(entry["data"], entry.key_lines["data"], where) if "data" in entry else {}
        max_attempts = None
        if "max_attempts" in entry:
            max_attempts = self.read_count(entry, "max_attempts", where, "executions of one effect key, the "
                                                                         "first included")
        approvals = 1
        if "approvals_required" in entry:
            approvals = self.read_count(entry, "approvals_required", where, "people who must approve")
            if approvals > 1:
                self.not_built(entry.key_lines["approvals_required"], where, "approvals_required")
        if "upstream" in entry:
            self.read_upstream(entry["upstream"], entry.key_lines["upstream"], where)
        return ActionEntry(
            name=name, decision=decision, rules=rules, effect=effect, resource=resource, mcp=mcp,
            controls=self.in_registry_order(cited), data=types.MappingProxyType(data),
            max_attempts=max_attempts, approvals_required=approvals,
        )

    def read_count(self, entry: _YamlMap, key: str, where: str, what: str) -> int:
        value, line = entry[key], entry.key_lines[key]
        if not _is_int(value) or value < 1:
            got = f"{_type_name(value)} ({value!r})" if isinstance(value, bool) else repr(value)
            self.fail(line, where, f"'{key}' must be an int of 1 or more (the number of {what}), "
                                   f"got {got}")
        return value

    def read_data(self, value: Any, line: int, where: str) -> dict[str, str]:
        """``data: {argument: label}`` or ``{argument: {label: label}}`` (v4)."""
        where = f"{where} data"
        if not isinstance(value, dict) or not value:
            self.fail(line, where, f"'data' must be a non-empty mapping of argument name to data label, got "
                                   f"{_type_name(value)}")
        labels: dict[str, str] = {}
        for argument, body in value.items():
            item_line = value.key_lines.get(argument, line)
            if argument == _DERIVED_SUBJECT:
                self.fail(item_line, where, f"{_DERIVED_SUBJECT!r} is the derived subject (the labels of a "
                                            f"call's data), so it cannot be labelled itself; rename the argument")
            if not argument.isidentifier():
                self.fail(item_line, where, f"{_shown(argument)} is not an argument name")
            if isinstance(body, dict):
                self.check_keys(body, _DATA_KEYS, item_line, f"{where} {argument!r}")
                if "label" not in body:
                    self.fail(item_line, where, f"{argument!r} needs a 'label'")
                label = self.read_label(body, "label", f"{where} {argument!r}")
            elif isinstance(body, str) and body.strip():
                label = body.strip()
                self.check_one_line(label, item_line, where, "the label")
            else:
                self.fail(item_line, where, f"the label of {argument!r} must be a non-empty string (or "
                                            f"{{label: ...}}), got {_type_name(body)}")
            labels[argument] = label
        return labels

    def read_upstream(self, value: Any, line: int, where: str) -> None:
        where = f"{where} upstream"
        if not isinstance(value, dict) or not value:
            self.fail(line, where, f"'upstream' must be a non-empty mapping of pins, got {_type_name(value)}")
        self.check_keys(value, _UPSTREAM_KEYS, line, where)
        for key, pin in value.items():
            if not isinstance(pin, str) or not pin.strip():
                self.fail(value.key_lines[key], where, f"'{key}' must be a non-empty string")
        self.not_built(line, where, "upstream")

    def read_decision(self, value: Any, line: int, where: str) -> Decision:
        if isinstance(value, str):
            decision = _DECISIONS.get(value)
            if decision is None:
                self.fail(line, where, f"unknown decision {value!r}, expected one of {_DECISIONS_LISTED}")
            return decision
        hint = " (YAML reads unquoted yes/no/on/off as booleans)" if isinstance(value, bool) else ""
        self.fail(
            line, where,
            f"unknown decision {value!r}, expected one of {_DECISIONS_LISTED} as a string, "
            f"got {_type_name(value)}{hint}",
        )

    def read_rules(self, value: Any, line: int, where: str, cited: list[str]) -> tuple[Rule, ...]:
        if not isinstance(value, list):
            self.fail(line, where, f"'rules' must be a non-empty list of rules, got {_type_name(value)}")
        if not value:
            self.fail(line, where, "'rules' is empty; give at least one rule, or use a bare 'decision'")
        rules = []
        for index, rule in enumerate(value):
            rule_line = value.item_lines[index]
            rule_where = f"{where} rule[{index}]"
            if not isinstance(rule, dict):
                self.fail(
                    rule_line, rule_where,
                    f"a rule must be a mapping with 'decision' and optionally 'when', got {_type_name(rule)}",
                )
            self.check_keys(rule, _RULE_KEYS, rule_line, rule_where)
            if "decision" not in rule:
                self.fail(rule_line, rule_where, "a rule needs a 'decision' (allow, approve or deny)")
            decision = self.read_decision(rule["decision"], rule.key_lines["decision"], rule_where)
            when: tuple[Condition, ...] = ()
            if "when" in rule:
                when = self.read_when(rule["when"], rule.key_lines["when"], rule_where)
            own: list[str] = []
            if "controls" in rule:
                own = self.read_citations(rule["controls"], rule.key_lines["controls"], rule_where)
            rules.append(Rule(index=index, when=when, decision=decision,
                              controls=self.in_registry_order(cited, own)))
        return tuple(rules)

    # -- conditions --------------------------------------------------------------------------

    def read_when(self, value: Any, line: int, where: str) -> tuple[Condition, ...]:
        if not isinstance(value, dict) or not value:
            got = "an empty mapping" if isinstance(value, dict) else _type_name(value)
            self.fail(
                line, where,
                f"'when' must be a non-empty mapping of conditions, got {got}; "
                f"leave 'when' out for a rule that always matches",
            )
        return tuple(
            self.read_condition(key, operand, value.key_lines.get(key, line), where)
            for key, operand in value.items()
        )

    def read_condition(self, key: str, operand: Any, line: int, where: str) -> Condition:
        argument, op = _split_condition(key)
        if op is None:
            self.fail(
                line, where,
                f"condition {key!r} must be '<argument>_<op>' where op is one of {_OPS_LISTED}",
            )
        if argument in _RESERVED_SUBJECTS:
            self.fail(
                line, where,
                f"condition {key!r} names the Action field {argument!r}, not an argument; conditions "
                f"see only the call's arguments",
            )
        this = f"condition {key!r}"
        if argument == _DERIVED_SUBJECT:
            if self.version < 4:
                # (The reference reads it under v3 as a missing argument, always false, so a 'deny'
                # rule written on it would silently never fire: refused here instead.)
                self.fail(
                    line, where,
                    f"{this}: " + self.needs_schema(f"the derived subject {_DERIVED_SUBJECT!r} (not an argument)", 4),
                )
            if op not in ("in", "eq", "neq") or not isinstance(operand, list) or not all(
                    isinstance(item, str) for item in operand):
                self.fail(
                    line, where,
                    f"{this}: '{_DERIVED_SUBJECT}' is the set of the call's data labels; test it with "
                    f"'{_DERIVED_SUBJECT}_in', '_eq' or '_neq' and a list of labels",
                )
            return Condition(key=key, argument=argument, op=op, operand=sorted(set(operand)))
        if op in _NUMERIC_OPS:
            if not _is_int(operand):
                shown = "" if operand is None or isinstance(operand, (dict, list)) else f" ({operand!r})"
                self.fail(
                    line, where,
                    f"{this}: a numeric operator needs an int operand, got {_type_name(operand)}{shown}",
                )
        elif op == "in":
            if not isinstance(operand, list):
                self.fail(line, where, f"{this}: 'in' needs a list operand, got {_type_name(operand)}")
        elif isinstance(operand, list):
            for index, item in enumerate(operand):
                if isinstance(item, (dict, list)):
                    self.fail(
                        line, where,
                        f"{this}: '{op}' takes a scalar, a mapping or a flat list; item {index} of this list "
                        f"is a {_type_name(item)} (use '_in' to test membership among lists)",
                    )
        return Condition(key=key, argument=argument, op=op, operand=_plain(operand))

    # -- templates and gateway options ---------------------------------------------------------

    def read_template(self, entry: _YamlMap, key: str, where: str) -> Template:
        value = entry[key]
        line = entry.key_lines[key]
        try:
            template = Template.parse(value)
        except InvalidArgument as exc:
            self.fail(line, f"{where} {key}", str(exc))
        if _DERIVED_SUBJECT in template.names:
            self.fail(
                line, f"{where} {key}",
                f"{template.text!r}: '{{{_DERIVED_SUBJECT}}}' is reserved (the derived subject of data labels) and "
                f"can be no argument's name; use another placeholder",
            )
        if key == "effect" and template.text.startswith(_RESERVED_EFFECT_PREFIX):
            self.fail(
                line, f"{where} {key}",
                f"{template.text!r}: effect keys starting {_RESERVED_EFFECT_PREFIX!r} are reserved for "
                f"ctrlrun's own policy changes; choose another prefix",
            )
        if _POLICY_CHANGE_ACTION in template.text:
            self.fail(
                line, f"{where} {key}",
                f"{template.text!r}: {_POLICY_CHANGE_ACTION!r} is reserved for ctrlrun's own policy changes",
            )
        return template

    def read_mcp(self, value: Any, line: int, where: str) -> dict:
        where = f"{where} mcp"
        if not isinstance(value, dict):
            self.fail(line, where, f"'mcp' must be a mapping of gateway options, got {_type_name(value)}")
        self.check_keys(value, _MCP_KEYS, line, where)
        flag = value.get("not_executed_on_error")
        if "not_executed_on_error" in value and not isinstance(flag, bool):
            self.fail(
                value.key_lines["not_executed_on_error"], where,
                f"'not_executed_on_error' must be true or false, got {_type_name(flag)} ({flag!r})",
            )
        return _plain(value)


def _split_condition(key: str) -> tuple[str, str | None]:
    """``amount_lte`` -> ``("amount", "lte")``; ``(key, None)`` when no ``_<op>`` suffix fits."""
    for op in _SPLIT_ORDER:
        suffix = "_" + op
        if key.endswith(suffix) and len(key) > len(suffix):
            return key[: -len(suffix)], op
    return key, None


# --------------------------------------------------------------------------------------------
# Entry points
# --------------------------------------------------------------------------------------------


def policy_hash(schema: str, actions: Any, environment: str, *, mode: str = "enforce",
                controls: Any = None, authority: Any = None) -> str:
    """§1.7: the hash of what decides calls: the actions and the ``controls:`` registry as written,
    the authority enforced (none yet), the resolved environment, the mode and the schema.
    ``version:`` is left out: relabelling a policy does not change what it decides."""
    return sha256_hash(
        canonical_bytes(
            {
                "actions": actions,
                "authority": authority,
                "controls": controls,
                "environment": environment,
                "mode": mode,
                "schema": schema,
            }
        )
    )


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a policy is built.

    Loading allocates a few objects per node and frees almost nothing until the end, which is
    the collector's worst case: on a policy of MAX_POLICY_BYTES it would take about half of the
    time. Reference counting still frees everything that is dropped; the collector is switched
    back on afterwards unless it was already off, as the caller's choice.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@dataclass(frozen=True)
class AuthorityDocument:
    """A standalone authority file (§C2): exactly ``schema`` and ``authority``, kept apart from the
    policy so that who writes grants need not be who writes rules. Its grants hash as an inline
    section's would."""

    authority: Authority
    schema: str
    source: str
    text: str

    @property
    def hash(self) -> str:
        """The document's own identity (what the store keeps it under)."""
        return sha256_hash(canonical_bytes({"authority": self.authority.canonical(), "schema": self.schema,
                                            "standalone": True}))


def parse_authority(text: str, source: str = "<authority>") -> AuthorityDocument:
    """Validate a standalone authority document: ``schema`` (v3 or later) and ``authority`` only."""
    if not isinstance(text, str):
        raise InvalidArgument(f"an authority document must be text (str), not {type(text).__name__}")
    source = str(source)
    reader = _Reader(source)
    with _collector_paused():
        document = _load_yaml(text, source)
        if not isinstance(document, dict):
            reader.fail(getattr(document, "line", None), "top level",
                        f"an authority document is a mapping with 'schema' and 'authority', got {_type_name(document)}")
        reader.check_values(document, "", document.line, set())
        reader.read_schema(document)
        for key in document:
            if key in ("actions", "mode", "environment", "controls", "version"):
                reader.fail(document.key_lines[key], "top level",
                            f"'{key}' belongs in the policy file: an authority document holds only 'schema' and "
                            f"'authority'")
        reader.check_keys(document, {"schema": 1, "authority": 3}, document.line, "top level")
        if "authority" not in document:
            reader.fail(document.line, "top level", "an authority document needs an 'authority' section")
        section = document["authority"]
        if isinstance(section, dict) and "break_glass" in section:
            reader.fail(section.key_lines["break_glass"], "authority",
                        "'break_glass' cannot be in a standalone authority document: its envelopes cite the "
                        "policy's controls, which this document cannot see")
        authority = reader.read_authority(section, document.key_lines["authority"])
    return AuthorityDocument(authority, reader.schema, source, text)


def _read_text(path: str | os.PathLike[str], what: str) -> tuple[str, str]:
    """The text of a policy-sized file (refused over MAX_POLICY_BYTES before reading it all)."""
    source = os.fspath(path)
    try:
        with open(source, "rb") as handle:
            # Never read more than the limit: a huge file (or /dev/zero) is refused by its size.
            size = os.fstat(handle.fileno()).st_size
            if size > MAX_POLICY_BYTES:
                raise _size_error(str(source), f"the {what} file is {size:,} bytes")
            data = handle.read(MAX_POLICY_BYTES + 1)
        if len(data) > MAX_POLICY_BYTES:
            raise _size_error(str(source), f"the {what} file is more than {MAX_POLICY_BYTES:,} bytes")
        # Universal newlines, as reading in text mode gives: the stored text is the same.
        return str(source), data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")
    except (OSError, UnicodeDecodeError) as exc:
        # The one message that does not start with "<source>:": the spec's wording, and the
        # path is in it anyway.
        error = PolicyError(f"{what} file {source} could not be read: {exc}")
        error.source, error.line, error.location = str(source), None, ""  # type: ignore[attr-defined]
        raise error from None


def load_authority(path: str | os.PathLike[str]) -> AuthorityDocument:
    """Read and parse a standalone authority file."""
    return parse_authority(*reversed(_read_text(path, "authority")))


def parse_policy(text: str, source: str = "<string>", *, environment: str | None = None,
                 authority: AuthorityDocument | None = None) -> Policy:
    """Validate a policy document and return the :class:`Policy`; PolicyError names what is wrong.

    ``environment`` is the caller's explicit environment (``Control(environment=)``, else the
    ``CTRLRUN_ENVIRONMENT`` setting or variable), or None: then the document's own
    ``environment:`` (v3) applies, else ``production``. The resolved value is part of the hash
    and of every action, because rules approved for staging are not an approval for production.
    ``authority`` is a standalone authority document (§C2) to enforce with it; a policy with its
    own ``authority:`` section cannot take one as well.
    """
    if not isinstance(text, str):
        raise InvalidArgument(f"a policy must be text (str), not {type(text).__name__}")
    if environment is not None and (not isinstance(environment, str) or not environment.strip()):
        raise InvalidArgument(f"environment must be a non-empty string, got {environment!r}")
    source = str(source)
    reader = _Reader(source)
    with _collector_paused():
        read = reader.read(_load_yaml(text, source))
        if authority is not None:
            if read.authority is not None:
                reader.fail(None, "top level",
                            f"this policy has its own 'authority:' section and {authority.source} declares one "
                            f"too: keep the grants in one place (remove the section, or the authority file)")
            read.authority = authority.authority
        resolved = environment.strip() if environment is not None else read.environment or DEFAULT_ENVIRONMENT
        try:
            digest = policy_hash(read.schema, read.raw_actions, resolved, mode=read.mode, controls=read.raw_controls,
                                 authority=read.authority.canonical() if read.authority is not None else None)
        except InvalidArgument as exc:  # a safety net: the loader refuses what canonical JSON cannot hold
            raise _policy_error(source, None, "actions", f"cannot be hashed: {exc}") from None
    return Policy(
        schema=read.schema,
        actions=types.MappingProxyType(read.entries),
        hash=digest,
        source=source,
        text=text,
        environment=resolved,
        mode=read.mode,
        version=read.version,
        controls=types.MappingProxyType(read.controls),
        authority=read.authority,
        authority_document=authority,
    )


def load_policy(path: str | os.PathLike[str], *, environment: str | None = None,
                authority: str | os.PathLike[str] | AuthorityDocument | None = None) -> Policy:
    """Read and parse the policy file at ``path`` (and, when given, a standalone authority file to
    enforce with it); messages name the paths as given."""
    if authority is not None and not isinstance(authority, AuthorityDocument):
        authority = load_authority(authority)
    source, text = _read_text(path, "policy")
    return parse_policy(text, source, environment=environment, authority=authority)


#: The id a delegated grant is read under until it has its own (``dlg_...``): never stored.
_UNNAMED_GRANT = "delegated-grant"


def parse_grant(text: str, source: str = "<grant>", *, ident: str | None = None) -> Grant:
    """One grant document without ``id`` (what ``delegate --file`` reads, and a delegation's stored
    ``grant_json``), validated as a grant of the newest schema; ``ident`` becomes its id. A grant
    that names its own ``id`` is refused (InvalidArgument): a delegation's id is made by ctrlrun."""
    if not isinstance(text, str):
        raise InvalidArgument(f"a grant must be text (str), not {type(text).__name__}")
    reader = _Reader(str(source))
    reader.schema, reader.version = _NEWEST_SUPPORTED, _SCHEMA_VERSION[_NEWEST_SUPPORTED]
    with _collector_paused():
        document = _load_yaml(text, str(source))
        if not isinstance(document, dict):
            reader.fail(getattr(document, "line", None), "top level",
                        f"a grant must be a mapping with 'subject' and 'actions', got {_type_name(document)}")
        reader.check_values(document, "", document.line, set())
        if "id" in document:
            raise InvalidArgument(f"{source}: a delegated grant has no 'id' (line {document.key_lines['id']}): "
                                  f"ctrlrun names each delegation (dlg_...); remove it")
        document["id"] = _UNNAMED_GRANT
        grant = reader.read_grant(document, document.line, "grant", {})
    return dataclasses.replace(grant, id=ident if ident is not None else "")


def grant_json(grant: Grant) -> str:
    """A grant as a delegation row keeps it: its canonical form (budgets' windows in seconds,
    ``expires_at`` ISO with its offset) as sorted JSON, without its id."""
    return json.dumps(grant.canonical(), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def grant_from_json(text: str, ident: str) -> Grant:
    """A delegation row's ``grant_json`` read back (and validated again) as the grant ``ident``;
    ValueError (a sentence) when it is not a grant ctrlrun wrote."""
    try:
        data = json.loads(text)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"grant_json is not JSON ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("subject"), dict):
        raise ValueError("grant_json is not a grant (no 'subject' mapping)")
    document: dict[str, Any] = {}
    subject = {key: value for key, value in data["subject"].items() if value is not None}
    document["subject"] = subject
    for key in ("actions", "resources", "environments", "tasks", "expires_at"):
        if data.get(key) is not None:
            document[key] = data[key]
    if data.get("delegable"):
        document["delegable"] = True
    if data.get("constraints") is not None:
        if not isinstance(data["constraints"], dict):
            raise ValueError("grant_json constraints are not a mapping")
        document["constraints"] = {key: (value or {}).get("operand") if isinstance(value, dict) else value
                                   for key, value in data["constraints"].items()}
    if data.get("budgets") is not None:
        if not isinstance(data["budgets"], list):
            raise ValueError("grant_json budgets are not a list")
        document["budgets"] = [{**budget, "window": f"PT{budget.get('window')}S"} if isinstance(budget, dict)
                               else budget for budget in data["budgets"]]
    unknown = set(data) - {"actions", "budgets", "constraints", "delegable", "environments", "expires_at",
                           "resources", "subject", "tasks"}
    if unknown:
        raise ValueError(f"grant_json has keys a grant does not: {', '.join(sorted(unknown))}")
    try:
        return parse_grant(json.dumps(document), f"delegation {ident}", ident=ident)
    except (PolicyError, InvalidArgument) as exc:
        raise ValueError(" ".join(str(exc).split())) from None
