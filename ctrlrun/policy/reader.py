"""Validation: the schema reader that turns a loaded document into a :class:`Policy`.

Closed key sets at every level; a key of a later schema than the document declares is refused
naming the schema it needs; every failure names file, line and key. No Django."""

from __future__ import annotations

import datetime as dt
import types
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn

from ..canonical import Template
from ..errors import InvalidArgument
from ..states import Decision
from .authority import MAX_AMOUNT, Authority, Budget, Grant, parse_window, validate_pattern
from .loader import (
    GRANT_ID, REFUSED_HINTS, Refused, YamlMap, describe_character, join, plain, policy_error, quoted,
    type_name,
)
from .model import ActionEntry, Condition, ControlEntry, Rule, is_int
from .schema import (
    MAX_CONTROL_ID, SUPPORTED_SCHEMAS, AUTHORITY_KEYS, BUDGET_KEYS, BUDGET_OPTIONAL, CURRENCY, CONTROL_KEYS,
    DATA_KEYS, DECISIONS, DECISIONS_LISTED, DERIVED_SUBJECT, ENTRY_KEYS, GRANT_KEYS, MCP_KEYS, MODES,
    NEWEST_SUPPORTED, NOT_BUILT, NUMERIC_OPS, OPS_LISTED, POLICY_CHANGE_ACTION, RESERVED_EFFECT_PREFIX,
    RESERVED_SUBJECTS, RULE_KEYS, SCHEMA_VERSION, SPLIT_ORDER, TOP_KEYS, UPSTREAM_KEYS,
)


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


class Reader:
    """Walks one loaded document, raising PolicyError at the first problem, building the entries."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.schema = ""
        self.version = 0
        self.registry: dict[str, ControlEntry] = {}

    def fail(self, line: int | None, location: str, message: str) -> NoReturn:
        """Raise the PolicyError for ``message`` at ``line`` / ``location`` of this source."""
        raise policy_error(self.source, line, location, message)

    # -- the whole document ------------------------------------------------------------------

    def check_values(self, value: Any, path: str, line: int | None, open_containers: set[int]) -> None:
        """Refuse anything but str, int, bool, null, lists and string-keyed maps, anywhere."""
        where = path or "top level"
        if isinstance(value, Refused):
            if value.message:
                self.fail(value.line, where, value.message)
            hint = REFUSED_HINTS.get(value.what, "")
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
                        if isinstance(key, Refused):
                            if key.key_message:
                                self.fail(key_line, where, key.key_message)
                            shown = f"{key.describe()} as a key"
                        else:
                            shown = f"the {type_name(key)} key {key!r}"
                        if isinstance(key, bool):
                            shown += " (YAML reads unquoted yes/no/on/off/true/false as booleans)"
                        self.fail(key_line, where, f"mapping keys must be strings, found {shown}; quote it")
                    if not key.isascii():
                        self.check_name(key, key_line, where)
                    self.check_values(item, join(path, key), key_line, open_containers)
            else:
                lines = getattr(value, "item_lines", [])
                for index, item in enumerate(value):
                    item_line = lines[index] if index < len(lines) else line
                    self.check_values(item, join(path, index), item_line, open_containers)
            open_containers.discard(id(value))
        elif not (value is None or isinstance(value, (str, int))):  # bool is an int
            self.fail(line, where, f"{type_name(value)} values are not allowed in a policy")

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
                    f"{what} {quoted(key)} contains {describe_character(char)}, which is invisible or "
                    f"reorders the text around it, so the name would display differently from what it "
                    f"is; remove it",
                )

    def read(self, document: Any) -> _Document:
        """Validate the loaded document; return what it says, ready to build the Policy from."""
        if document is None:
            self.fail(None, "", f"the policy is empty; it needs 'schema: {NEWEST_SUPPORTED}' and 'actions:'")
        if not isinstance(document, dict):
            self.fail(
                getattr(document, "line", None), "top level",
                f"a policy must be a mapping with 'schema' and 'actions', got {type_name(document)}",
            )
        self.check_values(document, "", document.line, set())
        self.read_schema(document)
        self.check_keys(document, TOP_KEYS, document.line, "top level")
        read = _Document(schema=self.schema)
        if "environment" in document:
            read.environment = self.read_label(document, "environment", "top level")
        if "mode" in document:
            read.mode = self.read_mode(document["mode"], document.key_lines["mode"])
        if "version" in document:
            read.version = self.read_label(document, "version", "top level")
        if "controls" in document:
            read.raw_controls = plain(document["controls"])
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
                f"'actions' must be a mapping of action name to entry, got {type_name(actions)}{missing}",
            )
        for name, entry in actions.items():
            read.entries[name] = self.read_entry(name, entry, actions.key_lines[name])
        read.raw_actions = plain(actions)
        return read

    def read_schema(self, document: YamlMap) -> None:
        """Accept a known schema (v1..v8); refuse anything else, listing them."""
        schema = document.get("schema")
        line = document.key_lines.get("schema", document.line)
        if schema in SUPPORTED_SCHEMAS:
            self.schema = schema
            self.version = SCHEMA_VERSION[schema]
            return
        self.fail(
            line if "schema" in document else None, "top level",
            f"unknown policy schema {schema!r}, expected one of {', '.join(SUPPORTED_SCHEMAS)}",
        )

    def check_keys(self, mapping: YamlMap, known: Mapping[str, int], line: int, location: str) -> None:
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
        """Refuse a feature this version reads but cannot enforce yet (see ``NOT_BUILT``)."""
        self.fail(
            line, location,
            f"{NOT_BUILT[feature]} is valid {self.schema!r}, but this version of ctrlrun does not enforce it "
            f"yet, and a policy is never half-applied: the whole document is refused. Remove it (or upgrade "
            f"ctrlrun when it is built)",
        )

    # -- top-level settings (v3, v4) ---------------------------------------------------------

    def read_label(self, mapping: YamlMap, key: str, where: str) -> str:
        """A non-empty one-line string (``environment``, ``version``), stripped."""
        value, line = mapping[key], mapping.key_lines[key]
        if not isinstance(value, str) or not value.strip():
            got = "a blank string" if isinstance(value, str) else type_name(value)
            self.fail(line, where, f"'{key}' must be a non-empty string, got {got}")
        value = value.strip()
        self.check_one_line(value, line, where, f"'{key}'")
        return value

    def check_one_line(self, value: str, line: int, where: str, what: str) -> None:
        for char in value:
            if char in "\n\r\t\u2028\u2029" or unicodedata.category(char) in ("Cc", "Cf"):
                self.fail(
                    line, where,
                    f"{what} {quoted(value)} contains {describe_character(char)}; it is shown on one line in "
                    f"receipts and the console, so it must be visible text: remove it",
                )

    def read_mode(self, value: Any, line: int) -> str:
        if isinstance(value, str) and value in MODES:
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
                                   f"{type_name(value)}")
        registry: dict[str, ControlEntry] = {}
        for ident, body in value.items():
            id_line = value.key_lines.get(ident, line)
            this = f"control {quoted(ident)}"
            if not ident or len(ident) > MAX_CONTROL_ID:
                self.fail(id_line, where, f"control ids must be 1 to {MAX_CONTROL_ID} characters, got {len(ident)}")
            self.check_one_line(ident, id_line, where, "the control id")
            if not isinstance(body, dict):
                self.fail(id_line, this, f"a control must be a mapping with 'title' (and optionally 'source'), "
                                         f"got {type_name(body)}")
            self.check_keys(body, CONTROL_KEYS, id_line, this)
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
            registry[ident] = ControlEntry(ident, title, source, role)
        return registry

    def read_citations(self, value: Any, line: int, where: str) -> list[str]:
        """A ``controls: [id, ...]`` citation on an entry or a rule: ids declared in the registry."""
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            self.fail(line, where, f"'controls' must be a list of control ids, got {type_name(value)}")
        declared = self.registry
        for item in value:
            if item not in declared:
                listed = ", ".join(repr(ident) for ident in declared) or "none (there is no 'controls:' registry)"
                self.fail(line, where, f"cites the control {quoted(item)}, which the 'controls:' registry does "
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
            self.fail(line, where, f"'authority' must be a mapping with 'grants', got {type_name(value)}")
        self.check_keys(value, AUTHORITY_KEYS, line, where)
        depth = value.get("max_delegation_depth", 3)
        if not is_int(depth) or depth < 0:
            self.fail(value.key_lines.get("max_delegation_depth", line), where,
                      f"'max_delegation_depth' must be an int of 0 or more, got {depth!r}")
        if "grants" not in value:
            self.fail(line, where, "'authority' needs 'grants' (a list; 'grants: []' permits nothing)")
        grants = value["grants"]
        if not isinstance(grants, list):
            self.fail(value.key_lines["grants"], where, f"'grants' must be a list of grants, got {type_name(grants)}")
        read: dict[str, Grant] = {}
        for index, grant in enumerate(grants):
            built = self.read_grant(grant, grants.item_lines[index], f"authority grants[{index}]", read)
            read[built.id] = built
        envelopes = value.get("break_glass")
        if envelopes is not None:
            if not isinstance(envelopes, dict):
                self.fail(value.key_lines["break_glass"], where,
                          f"'break_glass' must be a mapping of envelope id to grant, got {type_name(envelopes)}")
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
            self.fail(line, where, f"a grant must be a mapping, got {type_name(grant)}")
        self.check_keys(grant, GRANT_KEYS, line, where)
        ident = grant.get("id")
        if not isinstance(ident, str) or not GRANT_ID.match(ident) or ident.startswith("dlg_"):
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
                if _split_condition(key)[0] == DERIVED_SUBJECT:
                    self.fail(raw.key_lines[key], where,
                              f"constraint {key!r}: '{DERIVED_SUBJECT}' belongs to the policy's rules, not "
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
                                   f"{type_name(value)}")
        budgets = []
        for index, item in enumerate(value):
            item_line = value.item_lines[index]
            here = f"{where} budgets[{index}]"
            if not isinstance(item, dict):
                self.fail(item_line, here, f"a budget must be a mapping of metric, limit and window, got "
                                           f"{type_name(item)}")
            self.check_keys(item, {**BUDGET_KEYS, **BUDGET_OPTIONAL}, item_line, here)
            missing = [key for key in BUDGET_KEYS if key not in item]
            if missing:
                self.fail(item_line, here, f"a budget needs {', '.join(repr(k) for k in missing)}")
            metric, limit = item["metric"], item["limit"]
            if not isinstance(metric, str) or not (metric == "count" or metric.isidentifier()):
                self.fail(item.key_lines["metric"], here, f"'metric' is 'count' or the name of an int argument, "
                                                          f"got {metric!r}")
            if not is_int(limit) or limit < 0 or limit > MAX_AMOUNT:
                self.fail(item.key_lines["limit"], here, f"'limit' must be an int of 0 or more, at most "
                                                         f"{MAX_AMOUNT} (2**63 - 1), got {limit!r}")
            try:
                window = parse_window(item["window"])
            except ValueError as exc:
                self.fail(item.key_lines["window"], here, str(exc))
            currency = item.get("currency")
            if currency is not None:
                line_of = item.key_lines["currency"]
                if not isinstance(currency, str) or not CURRENCY.fullmatch(currency):
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
        if name == POLICY_CHANGE_ACTION:
            if self.version < 6:
                self.fail(line, where, self.needs_schema(f"the reserved action {name!r}", 6))
        if not isinstance(entry, dict):
            self.fail(
                line, where,
                f"an entry must be a mapping with 'decision' or 'rules', got {type_name(entry)}",
            )
        self.check_keys(entry, ENTRY_KEYS, line, where)
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
        upstream = self.read_upstream(entry["upstream"], entry.key_lines["upstream"], where) \
            if "upstream" in entry else None
        return ActionEntry(
            name=name, decision=decision, rules=rules, effect=effect, resource=resource, mcp=mcp,
            controls=self.in_registry_order(cited), data=types.MappingProxyType(data),
            max_attempts=max_attempts, approvals_required=approvals, upstream=upstream,
        )

    def read_count(self, entry: YamlMap, key: str, where: str, what: str) -> int:
        value, line = entry[key], entry.key_lines[key]
        if not is_int(value) or value < 1:
            got = f"{type_name(value)} ({value!r})" if isinstance(value, bool) else repr(value)
            self.fail(line, where, f"'{key}' must be an int of 1 or more (the number of {what}), "
                                   f"got {got}")
        return value

    def read_data(self, value: Any, line: int, where: str) -> dict[str, str]:
        """``data: {argument: label}`` or ``{argument: {label: label}}`` (v4)."""
        where = f"{where} data"
        if not isinstance(value, dict) or not value:
            self.fail(line, where, f"'data' must be a non-empty mapping of argument name to data label, got "
                                   f"{type_name(value)}")
        labels: dict[str, str] = {}
        for argument, body in value.items():
            item_line = value.key_lines.get(argument, line)
            if argument == DERIVED_SUBJECT:
                self.fail(item_line, where, f"{DERIVED_SUBJECT!r} is the derived subject (the labels of a "
                                            f"call's data), so it cannot be labelled itself; rename the argument")
            if not argument.isidentifier():
                self.fail(item_line, where, f"{quoted(argument)} is not an argument name")
            if isinstance(body, dict):
                self.check_keys(body, DATA_KEYS, item_line, f"{where} {argument!r}")
                if "label" not in body:
                    self.fail(item_line, where, f"{argument!r} needs a 'label'")
                label = self.read_label(body, "label", f"{where} {argument!r}")
            elif isinstance(body, str) and body.strip():
                label = body.strip()
                self.check_one_line(label, item_line, where, "the label")
            else:
                self.fail(item_line, where, f"the label of {argument!r} must be a non-empty string (or "
                                            f"{{label: ...}}), got {type_name(body)}")
            labels[argument] = label
        return labels

    def read_upstream(self, value: Any, line: int, where: str) -> types.MappingProxyType:
        """``upstream: {tls_cert_sha256: [pins], tls_cert_file: path|[paths], tool_schema_sha256: pin}``
        (v8, ``ctrlrun.upstream``): each pin ``sha256:<64 hex>``; each PEM file must hash to a listed pin."""
        from ..upstream import PIN_PATTERN, pem_cert_hash, pem_first_certificate

        where = f"{where} upstream"
        if not isinstance(value, dict) or not value:
            self.fail(line, where, f"'upstream' must be a non-empty mapping of pins, got {type_name(value)}")
        self.check_keys(value, UPSTREAM_KEYS, line, where)
        shape = "'sha256:' followed by 64 lowercase hex digits"
        pins: dict[str, Any] = {}
        if "tool_schema_sha256" in value:
            pin = value["tool_schema_sha256"]
            if not isinstance(pin, str) or not PIN_PATTERN.match(pin):
                self.fail(value.key_lines["tool_schema_sha256"], where, f"'tool_schema_sha256' must be {shape}, "
                                                                        f"got {pin!r}")
            pins["tool_schema_sha256"] = pin
        digests: list[str] = []
        if "tls_cert_sha256" in value:
            listed = value["tls_cert_sha256"]
            listed = [listed] if isinstance(listed, str) else listed
            if not isinstance(listed, list) or not listed or not all(
                    isinstance(pin, str) and PIN_PATTERN.match(pin) for pin in listed):
                self.fail(value.key_lines["tls_cert_sha256"], where, f"'tls_cert_sha256' must be a list (for "
                                                                     f"rotation) of {shape}")
            digests = list(listed)
        if "tls_cert_file" in value:
            files = value["tls_cert_file"]
            files = [files] if isinstance(files, str) else files
            file_line = value.key_lines["tls_cert_file"]
            if not isinstance(files, list) or not files or not all(isinstance(f, str) and f.strip() for f in files):
                self.fail(file_line, where, "'tls_cert_file' must be a PEM file's path or a list of them")
            if not digests:
                self.fail(file_line, where, "'tls_cert_file' needs 'tls_cert_sha256' listing the digest each file "
                                            "must hash to (a file alone could be swapped)")
            pems = []
            for path in files:
                try:
                    with open(path, encoding="ascii") as handle:
                        pem = handle.read()
                    digest = pem_cert_hash(pem)
                except (OSError, ValueError, UnicodeError) as exc:
                    self.fail(file_line, where, f"'tls_cert_file' {path!r} is not a readable PEM certificate ({exc})")
                if digest not in digests:
                    self.fail(file_line, where, f"'tls_cert_file' {path!r} hashes to {digest}, which "
                                                f"'tls_cert_sha256' does not list")
                pems.append(pem_first_certificate(pem))
            # The certificate read and checked now is what the gateway trusts (pinned_context), not the
            # file as it is later; only the certificate that was hashed (a file's first).
            pins["tls_cert_pem"] = tuple(pems)
        if digests:
            pins["tls_cert_sha256"] = tuple(digests)
        return types.MappingProxyType(pins)

    def read_decision(self, value: Any, line: int, where: str) -> Decision:
        if isinstance(value, str):
            decision = DECISIONS.get(value)
            if decision is None:
                self.fail(line, where, f"unknown decision {value!r}, expected one of {DECISIONS_LISTED}")
            return decision
        hint = " (YAML reads unquoted yes/no/on/off as booleans)" if isinstance(value, bool) else ""
        self.fail(
            line, where,
            f"unknown decision {value!r}, expected one of {DECISIONS_LISTED} as a string, "
            f"got {type_name(value)}{hint}",
        )

    def read_rules(self, value: Any, line: int, where: str, cited: list[str]) -> tuple[Rule, ...]:
        if not isinstance(value, list):
            self.fail(line, where, f"'rules' must be a non-empty list of rules, got {type_name(value)}")
        if not value:
            self.fail(line, where, "'rules' is empty; give at least one rule, or use a bare 'decision'")
        rules = []
        for index, rule in enumerate(value):
            rule_line = value.item_lines[index]
            rule_where = f"{where} rule[{index}]"
            if not isinstance(rule, dict):
                self.fail(
                    rule_line, rule_where,
                    f"a rule must be a mapping with 'decision' and optionally 'when', got {type_name(rule)}",
                )
            self.check_keys(rule, RULE_KEYS, rule_line, rule_where)
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
            got = "an empty mapping" if isinstance(value, dict) else type_name(value)
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
                f"condition {key!r} must be '<argument>_<op>' where op is one of {OPS_LISTED}",
            )
        if argument in RESERVED_SUBJECTS:
            self.fail(
                line, where,
                f"condition {key!r} names the Action field {argument!r}, not an argument; conditions "
                f"see only the call's arguments",
            )
        this = f"condition {key!r}"
        if argument == DERIVED_SUBJECT:
            if self.version < 4:
                # (The reference reads it under v3 as a missing argument, always false, so a 'deny'
                # rule written on it would silently never fire: refused here instead.)
                self.fail(
                    line, where,
                    f"{this}: " + self.needs_schema(f"the derived subject {DERIVED_SUBJECT!r} (not an argument)", 4),
                )
            if op not in ("in", "eq", "neq") or not isinstance(operand, list) or not all(
                    isinstance(item, str) for item in operand):
                self.fail(
                    line, where,
                    f"{this}: '{DERIVED_SUBJECT}' is the set of the call's data labels; test it with "
                    f"'{DERIVED_SUBJECT}_in', '_eq' or '_neq' and a list of labels",
                )
            return Condition(key=key, argument=argument, op=op, operand=sorted(set(operand)))
        if op in NUMERIC_OPS:
            if not is_int(operand):
                shown = "" if operand is None or isinstance(operand, (dict, list)) else f" ({operand!r})"
                self.fail(
                    line, where,
                    f"{this}: a numeric operator needs an int operand, got {type_name(operand)}{shown}",
                )
        elif op == "in":
            if not isinstance(operand, list):
                self.fail(line, where, f"{this}: 'in' needs a list operand, got {type_name(operand)}")
        elif isinstance(operand, list):
            for index, item in enumerate(operand):
                if isinstance(item, (dict, list)):
                    self.fail(
                        line, where,
                        f"{this}: '{op}' takes a scalar, a mapping or a flat list; item {index} of this list "
                        f"is a {type_name(item)} (use '_in' to test membership among lists)",
                    )
        return Condition(key=key, argument=argument, op=op, operand=plain(operand))

    # -- templates and gateway options ---------------------------------------------------------

    def read_template(self, entry: YamlMap, key: str, where: str) -> Template:
        value = entry[key]
        line = entry.key_lines[key]
        try:
            template = Template.parse(value)
        except InvalidArgument as exc:
            self.fail(line, f"{where} {key}", str(exc))
        if DERIVED_SUBJECT in template.names:
            self.fail(
                line, f"{where} {key}",
                f"{template.text!r}: '{{{DERIVED_SUBJECT}}}' is reserved (the derived subject of data labels) and "
                f"can be no argument's name; use another placeholder",
            )
        if key == "effect" and template.text.startswith(RESERVED_EFFECT_PREFIX):
            self.fail(
                line, f"{where} {key}",
                f"{template.text!r}: effect keys starting {RESERVED_EFFECT_PREFIX!r} are reserved for "
                f"ctrlrun's own policy changes; choose another prefix",
            )
        if POLICY_CHANGE_ACTION in template.text:
            self.fail(
                line, f"{where} {key}",
                f"{template.text!r}: {POLICY_CHANGE_ACTION!r} is reserved for ctrlrun's own policy changes",
            )
        return template

    def read_mcp(self, value: Any, line: int, where: str) -> dict:
        where = f"{where} mcp"
        if not isinstance(value, dict):
            self.fail(line, where, f"'mcp' must be a mapping of gateway options, got {type_name(value)}")
        self.check_keys(value, MCP_KEYS, line, where)
        flag = value.get("not_executed_on_error")
        if "not_executed_on_error" in value and not isinstance(flag, bool):
            self.fail(
                value.key_lines["not_executed_on_error"], where,
                f"'not_executed_on_error' must be true or false, got {type_name(flag)} ({flag!r})",
            )
        return plain(value)


def _split_condition(key: str) -> tuple[str, str | None]:
    """``amount_lte`` -> ``("amount", "lte")``; ``(key, None)`` when no ``_<op>`` suffix fits."""
    for op in SPLIT_ORDER:
        suffix = "_" + op
        if key.endswith(suffix) and len(key) > len(suffix):
            return key[: -len(suffix)], op
    return key, None


