"""The policy as data: conditions, rules, entries and the :class:`Policy` that decides each call.

Evaluation is pure and cheap (it runs on every protected call): everything that can be decided
when the file is read is decided there. No Django."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..canonical import Template, strict_equal
from ..errors import InvalidArgument
from ..states import Decision
from .authority import Authority
from .schema import DERIVED_SUBJECT, OPS_LISTED, logger


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


def is_int(value: Any) -> bool:
    """An int that is not a bool (``bool`` subclasses ``int``; ``True >= 0`` must not pass)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _numeric(compare: Callable[[int, int], bool]) -> Callable[[Condition, str, Any], bool]:
    def test(condition: Condition, action: str, value: Any) -> bool:
        if value.__class__ is int or is_int(value):
            return compare(value, condition.operand)
        logger.warning(
            "%s: condition %s ignored: argument '%s' is %s, not int",
            action, condition.key, condition.argument, type(value).__name__,
        )
        return False

    return test


def _test_eq(condition: Condition, action: str, value: Any) -> bool:
    return strict_equal(value, condition.operand)


def _test_neq(condition: Condition, action: str, value: Any) -> bool:
    return not strict_equal(value, condition.operand)


def _test_in(condition: Condition, action: str, value: Any) -> bool:
    return any(strict_equal(value, item) for item in condition.operand)


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
            raise InvalidArgument(f"unknown condition operator {self.op!r}; expected one of {OPS_LISTED}")
        if self.argument == DERIVED_SUBJECT and self.op == "in":
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
    ``max_attempts`` (None: unbounded); from v6 ``approvals_required`` (1 unless written); from v8
    ``upstream`` (the gateway's pins, ``ctrlrun.upstream``; None when absent).
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
    upstream: Mapping[str, Any] | None = None
    _evaluation: Evaluation | None = field(init=False, repr=False, compare=False)
    _no_match: Evaluation = field(init=False, repr=False, compare=False)
    _scoped: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        fixed = None if self.decision is None else Evaluation(Decision(self.decision), "decision", self.controls)
        object.__setattr__(self, "_evaluation", fixed)
        no_match = Evaluation(Decision.DENY, "no_matching_rule", self.controls) if self.controls else _NO_MATCHING_RULE
        object.__setattr__(self, "_no_match", no_match)
        scoped = any(c.argument == DERIVED_SUBJECT for rule in self.rules for c in rule.when)
        object.__setattr__(self, "_scoped", scoped)

    def data_scope(self, arguments: Mapping[str, Any]) -> list[str]:
        """The labels of this call's data (v4): those of the labelled arguments present, sorted, once each."""
        return sorted({label for argument, label in self.data.items() if argument in arguments})

    def evaluate(self, arguments: Mapping[str, Any]) -> Evaluation:
        """The entry's verdict: its bare decision, else the first matching rule, else deny."""
        if self._evaluation is not None:
            return self._evaluation
        if self._scoped:  # the derived subject, where the rules can see it (never an argument's name)
            arguments = {**arguments, DERIVED_SUBJECT: self.data_scope(arguments)}
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

    def approving_actions(self) -> frozenset[str]:
        """The actions every verdict of which is ``approve`` (a bare ``decision: approve``, or rules
        that all decide ``approve``): what the approved-policy flow asks of ``ctrlrun.policy.change``."""
        return frozenset(
            name for name, entry in self.actions.items()
            if (entry.decision is Decision.APPROVE if entry.decision is not None else
                bool(entry.rules) and all(rule.decision is Decision.APPROVE for rule in entry.rules)))

    def denies_outright(self, name: str) -> bool:
        """Whether every call of ``name`` is denied by the policy, whatever its arguments and whoever
        makes it: the policy does not name it (``unknown_action``), its entry is a bare ``decision:
        deny``, or every one of its rules decides ``deny`` (no matching rule denies too). Never in
        observe mode, which refuses nothing. What the gateway's ``--hide-denied-tools`` leaves out."""
        if self.observing:
            return False
        entry = self.actions.get(name)
        if entry is None:
            return True
        if entry.decision is not None:
            return Decision(entry.decision) is Decision.DENY
        return all(Decision(rule.decision) is Decision.DENY for rule in entry.rules)

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


