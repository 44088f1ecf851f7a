"""Schemas v3..v8 (reference-capabilities §B1-B6): every key read at its gate, validated, hashed."""
from __future__ import annotations

import textwrap

import pytest

from ctrlrun.canonical import canonical_bytes, sha256_hash
from ctrlrun.errors import PolicyError
from ctrlrun.policy import ControlEntry, Evaluation, parse_policy
from ctrlrun.states import Decision


def doc(body: str, version: int = 8) -> str:
    return f"schema: ctrlrun.policy/v{version}\n" + textwrap.dedent(body)


def refused(text: str, *fragments: str, **options: object) -> str:
    with pytest.raises(PolicyError) as caught:
        parse_policy(text, **options)  # type: ignore[arg-type]
    message = str(caught.value)
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    return message


REGISTRY = """\
    version: "2026-12-a"
    controls:
      pci-3.4: {title: "Render PAN unreadable", source: "PCI DSS v4.0"}
      soc2-cc6.1: {title: "Logical access"}
      gdpr-32: {title: "Security of processing"}
    actions:
      stripe.refund:
        controls: [gdpr-32, pci-3.4]
        effect: "refund:{payment_id}"
        rules:
          - when: {amount_lte: 50000}
            decision: allow
            controls: [soc2-cc6.1]
          - decision: approve
      read.note: {decision: allow}
    """


class TestEnvironment:
    def test_policy_environment_used_when_nothing_overrides(self) -> None:
        policy = parse_policy(doc("environment: ' staging '\nactions: {}\n", 3))
        assert policy.environment == "staging"

    def test_explicit_environment_wins_over_the_policy(self) -> None:
        assert parse_policy(doc("environment: staging\nactions: {}\n", 3), environment="prod-eu").environment == "prod-eu"

    def test_default_is_production(self) -> None:
        assert parse_policy(doc("actions: {}\n", 3)).environment == "production"

    def test_environment_is_in_the_hash(self) -> None:
        staging = parse_policy(doc("environment: staging\nactions: {}\n", 3))
        production = parse_policy(doc("environment: production\nactions: {}\n", 3))
        default = parse_policy(doc("actions: {}\n", 3))
        assert staging.hash != production.hash
        assert production.hash == default.hash  # the resolved value is hashed, not the text

    @pytest.mark.parametrize("value", ["''", "'   '", "7", "[a]", "null"])
    def test_blank_or_not_a_string_refused(self, value: str) -> None:
        refused(doc(f"environment: {value}\nactions: {{}}\n", 3), "line 2", "'environment' must be a non-empty string")

    def test_needs_v3(self) -> None:
        refused(doc("environment: staging\nactions: {}\n", 2), "line 2", "'environment' needs 'schema: ctrlrun.policy/v3'",
                "declares 'ctrlrun.policy/v2'")


class TestMode:
    def test_observe_and_enforce(self) -> None:
        assert parse_policy(doc("mode: observe\nactions: {}\n", 3)).mode == "observe"
        assert parse_policy(doc("mode: observe\nactions: {}\n", 3)).observing
        assert parse_policy(doc("mode: enforce\nactions: {}\n", 3)).mode == "enforce"
        assert parse_policy(doc("actions: {}\n", 3)).mode == "enforce"

    def test_mode_is_in_the_hash(self) -> None:
        observe = parse_policy(doc("mode: observe\nactions: {}\n", 3))
        enforce = parse_policy(doc("mode: enforce\nactions: {}\n", 3))
        assert observe.hash != enforce.hash
        assert enforce.hash == parse_policy(doc("actions: {}\n", 3)).hash

    @pytest.mark.parametrize("value", ["off", "false", "no"])
    def test_yaml_booleans_refused_with_the_reason(self, value: str) -> None:
        refused(doc(f"mode: {value}\nactions: {{}}\n", 3), "line 2", "'mode' must be 'enforce' or 'observe', got False",
                "booleans")

    @pytest.mark.parametrize("value", ["Observe", "shadow", "'observe '", "1"])
    def test_other_values_refused(self, value: str) -> None:
        refused(doc(f"mode: {value}\nactions: {{}}\n", 3), "'mode' must be 'enforce' or 'observe'")

    def test_mode_on_an_entry_gets_its_own_message(self) -> None:
        refused(doc("actions:\n  a: {decision: allow, mode: observe}\n", 3), "line 3", "only allowed at the top level",
                "half-enforced")


class TestVersionAndControls:
    def test_registry_citations_and_version(self) -> None:
        policy = parse_policy(doc(REGISTRY, 4))
        assert policy.version == "2026-12-a"
        assert list(policy.controls) == ["pci-3.4", "soc2-cc6.1", "gdpr-32"]
        assert policy.controls["pci-3.4"] == ControlEntry("pci-3.4", "Render PAN unreadable", "PCI DSS v4.0", None)
        entry = policy.entry("stripe.refund")
        assert entry is not None and entry.controls == ("pci-3.4", "gdpr-32")  # registry order, not citation order
        # A matched rule: the union, in registry order.
        assert policy.evaluate("stripe.refund", {"amount": 1}) == Evaluation(
            Decision.ALLOW, "rule[0]", ("pci-3.4", "soc2-cc6.1", "gdpr-32"))
        # Another rule: the entry's only.
        assert policy.evaluate("stripe.refund", {"amount": 99999}).controls == ("pci-3.4", "gdpr-32")
        assert policy.evaluate("read.note", {}).controls == ()
        assert policy.evaluate("nothing", {}).controls == ()

    def test_no_matching_rule_cites_the_entry(self) -> None:
        policy = parse_policy(doc("""\
            controls: {c: {title: T}}
            actions:
              a:
                controls: [c]
                rules: [{when: {n_eq: 1}, decision: allow}]
            """, 4))
        assert policy.evaluate("a", {"n": 2}) == Evaluation(Decision.DENY, "no_matching_rule", ("c",))

    def test_version_is_not_hashed_the_registry_is(self) -> None:
        base = parse_policy(doc(REGISTRY, 4))
        relabelled = parse_policy(doc(REGISTRY.replace("2026-12-a", "2027-01"), 4))
        retitled = parse_policy(doc(REGISTRY.replace("Logical access", "Logical access control"), 4))
        assert base.hash == relabelled.hash
        assert base.hash != retitled.hash

    def test_hash_is_the_documented_form(self) -> None:
        text = doc("""\
            mode: observe
            environment: staging
            controls: {c: {title: T}}
            actions: {a: {decision: allow, controls: [c]}}
            """, 4)
        expected = sha256_hash(canonical_bytes({
            "actions": {"a": {"decision": "allow", "controls": ["c"]}},
            "authority": None,
            "controls": {"c": {"title": "T"}},
            "environment": "staging",
            "mode": "observe",
            "schema": "ctrlrun.policy/v4",
        }))
        assert parse_policy(text).hash == expected

    def test_unknown_citation_lists_the_declared_ids(self) -> None:
        refused(doc(REGISTRY.replace("[gdpr-32, pci-3.4]", "[gdpr-33]"), 4), "line 9", "'gdpr-33'",
                "declared: 'pci-3.4', 'soc2-cc6.1', 'gdpr-32'")

    def test_citation_without_registry(self) -> None:
        refused(doc("actions: {a: {decision: allow, controls: [c]}}\n", 4), "'c'", "no 'controls:' registry")

    def test_rule_citation_checked(self) -> None:
        refused(doc(REGISTRY.replace("[soc2-cc6.1]", "[nope]"), 4), "line 14", "rule[0]", "'nope'")

    @pytest.mark.parametrize(("registry", "fragment"), [
        ("{c: {source: x}}", "needs a 'title'"),
        ("{c: {title: ''}}", "'title' must be a non-empty string"),
        ("{c: {title: T, owner: me}}", "unknown key(s) 'owner'"),
        ("{c: T}", "a control must be a mapping"),
        ("[c]", "'controls' must be a mapping"),
        ('{"a\\u202eb": {title: T}}', "U+202E"),
        ('{"a\\tb": {title: T}}', "U+0009"),
        ("{c: {title: \"two\\nlines\"}}", "U+000A"),
    ])
    def test_bad_registry(self, registry: str, fragment: str) -> None:
        refused(doc(f"controls: {registry}\nactions: {{}}\n", 4), fragment)

    def test_control_id_length(self) -> None:
        parse_policy(doc(f"controls: {{{'c' * 200}: {{title: T}}}}\nactions: {{}}\n", 4))
        refused(doc(f"controls: {{{'c' * 201}: {{title: T}}}}\nactions: {{}}\n", 4), "1 to 200 characters")

    def test_duplicate_citation(self) -> None:
        refused(doc("controls: {c: {title: T}}\nactions: {a: {decision: allow, controls: [c, c]}}\n", 4), "twice")

    @pytest.mark.parametrize(("key", "value"), [("version", "'x'"), ("controls", "{}")])
    def test_needs_v4(self, key: str, value: str) -> None:
        refused(doc(f"actions: {{}}\n{key}: {value}\n", 3), "line 3", f"'{key}' needs 'schema: ctrlrun.policy/v4'")

    def test_version_blank_refused(self) -> None:
        refused(doc("version: ' '\nactions: {}\n", 4), "'version' must be a non-empty string")

    def test_approver_role_needs_v6_and_loads(self) -> None:
        refused(doc("controls: {c: {title: T, approver_role: finance}}\nactions: {}\n", 5), "line 2",
                "'approver_role' needs 'schema: ctrlrun.policy/v6'")
        policy = parse_policy(doc("controls: {c: {title: T, approver_role: finance}}\nactions: {}\n", 6))
        assert policy.controls["c"].approver_role == "finance"
        refused(doc("controls: {c: {title: T, approver_role: ' finance'}}\nactions: {}\n", 6), "leading or trailing")


class TestDataLabels:
    POLICY = """\
        actions:
          read.note:
            data: {patient_id: phi, note: {label: internal}, card: pci}
            rules:
              - when: {data_scope_in: [phi]}
                decision: approve
              - when: {data_scope_eq: [internal]}
                decision: allow
              - when: {data_scope_neq: [internal, pci]}
                decision: deny
              - decision: allow
        """

    def test_labels_and_scope(self) -> None:
        policy = parse_policy(doc(self.POLICY, 4))
        entry = policy.entry("read.note")
        assert entry is not None and dict(entry.data) == {"patient_id": "phi", "note": "internal", "card": "pci"}
        assert entry.data_scope({"note": "x", "patient_id": None, "other": 1}) == ["internal", "phi"]
        # A present argument counts even when its value is None (defaults are applied before deciding).
        assert policy.evaluate("read.note", {"note": "x", "patient_id": None}).reason == "rule[0]"
        assert policy.evaluate("read.note", {"note": "x"}).reason == "rule[1]"
        assert policy.evaluate("read.note", {"card": "4242"}).reason == "rule[2]"  # {pci} != {internal, pci}
        # _eq / _neq compare as sets, whatever order the operand is written in.
        assert policy.evaluate("read.note", {"card": "4242", "note": "x"}).reason == "rule[3]"
        assert policy.evaluate("read.note", {}).reason == "rule[2]"  # the empty set differs from {internal, pci}

    def test_set_comparison_ignores_operand_order(self) -> None:
        policy = parse_policy(doc("""\
            actions:
              a:
                data: {x: b, y: a}
                rules: [{when: {data_scope_eq: [b, a, a]}, decision: allow}]
            """, 4))
        assert policy.evaluate("a", {"x": 1, "y": 2}).decision is Decision.ALLOW
        assert policy.evaluate("a", {"x": 1}).decision is Decision.DENY

    def test_an_argument_called_data_scope_cannot_fool_the_rule(self) -> None:
        """The derived value replaces anything under that name (the name is reserved everywhere)."""
        policy = parse_policy(doc("""\
            actions:
              a:
                data: {x: phi}
                rules:
                  - {when: {data_scope_in: [phi]}, decision: deny}
                  - {decision: allow}
            """, 4))
        assert policy.evaluate("a", {"x": 1, "data_scope": []}).decision is Decision.DENY

    @pytest.mark.parametrize(("data", "fragment"), [
        ("{data_scope: x}", "derived subject"),
        ("{x: {label: phi, redact: true}}", "'redact' is not part of the format"),
        ("{x: ''}", "non-empty string"),
        ("{x: 3}", "non-empty string"),
        ("{x: {}}", "needs a 'label'"),
        ("{}", "non-empty mapping"),
        ("[x]", "non-empty mapping"),
        ("{'a-b': phi}", "not an argument name"),
    ])
    def test_bad_data(self, data: str, fragment: str) -> None:
        refused(doc(f"actions:\n  a: {{decision: allow, data: {data}}}\n", 4), "line 3", fragment)

    @pytest.mark.parametrize("when", ["{data_scope_lt: 3}", "{data_scope_in: phi}", "{data_scope_eq: [1]}"])
    def test_bad_scope_conditions(self, when: str) -> None:
        refused(doc(f"actions:\n  a:\n    rules: [{{when: {when}, decision: allow}}]\n", 4), "data_scope")

    @pytest.mark.parametrize("version", [2, 3])
    def test_scope_before_v4_refused(self, version: int) -> None:
        """Below v4 a data_scope rule is refused (a deliberate departure: the reference reads it under v3
        as always false, so a deny rule on it would never fire)."""
        refused(doc("actions:\n  a:\n    rules: [{when: {data_scope_in: [phi]}, decision: deny}]\n", version),
                "ctrlrun.policy/v4")

    def test_data_needs_v4(self) -> None:
        refused(doc("actions:\n  a:\n    decision: allow\n    data: {x: phi}\n", 3), "line 5",
                "'data' needs 'schema: ctrlrun.policy/v4'")

    def test_template_placeholder_reserved(self) -> None:
        refused(doc("actions:\n  a: {decision: allow, effect: 'k:{data_scope}'}\n", 4), "reserved")


class TestAttemptsAndApprovals:
    def test_max_attempts(self) -> None:
        entry = parse_policy(doc("actions:\n  a: {decision: allow, max_attempts: 2}\n", 5)).entry("a")
        assert entry is not None and entry.max_attempts == 2
        assert parse_policy(doc("actions:\n  a: {decision: allow}\n", 5)).entry("a").max_attempts is None  # type: ignore[union-attr]

    @pytest.mark.parametrize("value", ["0", "-1", "true", "'2'", "[2]"])
    def test_bad_max_attempts(self, value: str) -> None:
        refused(doc(f"actions:\n  a:\n    decision: allow\n    max_attempts: {value}\n", 5), "line 5",
                "'max_attempts' must be an int of 1 or more")

    def test_max_attempts_gate_names_the_line(self) -> None:
        refused(doc("actions:\n  a:\n    decision: allow\n    max_attempts: 2\n", 4),
                "<string>, line 5: action 'a': 'max_attempts' needs 'schema: ctrlrun.policy/v5'")

    def test_approvals_required(self) -> None:
        assert parse_policy(doc("actions:\n  a: {decision: approve, approvals_required: 1}\n", 6)).entry(
            "a").approvals_required == 1  # type: ignore[union-attr]
        assert parse_policy(doc("actions:\n  a: {decision: approve, approvals_required: 2}\n", 6)).entry(
            "a").approvals_required == 2  # type: ignore[union-attr]
        refused(doc("actions:\n  a: {decision: approve, approvals_required: 0}\n", 6), "int of 1 or more")
        refused(doc("actions:\n  a: {decision: approve, approvals_required: true}\n", 6), "int of 1 or more")
        refused(doc("actions:\n  a:\n    decision: approve\n    approvals_required: 1\n", 5), "line 5",
                "'approvals_required' needs 'schema: ctrlrun.policy/v6'")

    def test_policy_change_action(self) -> None:
        refused(doc("actions:\n  ctrlrun.policy.change: {decision: approve}\n", 5), "line 3", "ctrlrun.policy/v6")
        # Built (the approved-policy flow, docs/policy-changes.md): declarable from v6 on.
        policy = parse_policy(doc("actions:\n  ctrlrun.policy.change: {decision: approve}\n", 6))
        assert policy.approving_actions() == frozenset({"ctrlrun.policy.change"})


class TestUpstreamPins:
    PIN = "sha256:" + "ab" * 32

    def test_upstream_pins_load_from_v8(self) -> None:
        refused(doc("actions:\n  a:\n    decision: allow\n    upstream: {tls_cert_sha256: abc}\n", 7), "line 5",
                "'upstream' needs 'schema: ctrlrun.policy/v8'")
        policy = parse_policy(doc(f"actions:\n  a:\n    decision: allow\n    upstream:\n      tool_schema_sha256: "
                                  f"'{self.PIN}'\n      tls_cert_sha256: ['{self.PIN}']\n", 8))
        pins = policy.entry("a").upstream  # type: ignore[union-attr]
        assert dict(pins) == {"tool_schema_sha256": self.PIN, "tls_cert_sha256": (self.PIN,)}

    @pytest.mark.parametrize(("pins", "says"), [
        ("{pin: abc}", "unknown key(s) 'pin'"),
        ("{tool_schema_sha256: abc}", "'tool_schema_sha256' must be 'sha256:' followed by 64"),
        ("{tls_cert_sha256: [sha256:xyz]}", "'tls_cert_sha256' must be a list"),
        ("{tls_cert_file: /nonexistent.pem}", "needs 'tls_cert_sha256'"),
        (f"{{tls_cert_sha256: ['{PIN}'], tls_cert_file: /nonexistent.pem}}", "not a readable PEM certificate"),
        ("{}", "non-empty mapping of pins"),
    ])
    def test_bad_pins_are_refused_with_the_line(self, pins: str, says: str) -> None:
        refused(doc(f"actions:\n  a:\n    decision: allow\n    upstream: {pins}\n", 8), "line 5", says)


class TestNotBuiltYet:
    AUTHORITY = """\
        authority:
          max_delegation_depth: 2
          grants:
            - id: support
              subject: {agent: "support-*"}
              actions: ["stripe.*"]
              resources: ["payment:*"]
              constraints: {amount_lte: 50000}
        actions: {}
        """

    def test_authority_loads(self) -> None:
        policy = parse_policy(doc(self.AUTHORITY, 3))
        assert policy.authority is not None and list(policy.authority.grants) == ["support"]
        assert policy.authority.max_delegation_depth == 2

    def test_break_glass_is_refused_as_not_built(self) -> None:
        text = doc(self.AUTHORITY.replace("        actions: {}", "          break_glass: {}\n        actions: {}"), 3)
        refused(text, "'break_glass' envelopes", "does not enforce it yet")

    @pytest.mark.parametrize(("change", "fragment"), [
        (("id: support", "id: dlg_x"), "not 'dlg_'"),
        (("id: support", "id: -x"), "'id'"),
        (("subject: {agent: \"support-*\"}", "subject: {}"), "'subject'"),
        (("actions: [\"stripe.*\"]", "actions: []"), "'actions' must be a non-empty list"),
        (("constraints: {amount_lte: 50000}", "constraints: {amount_lte: x}"), "int operand"),
        (("constraints: {amount_lte: 50000}", "constraints: {data_scope_in: [a]}"), "authority constraints"),
        (("constraints: {amount_lte: 50000}", "colour: red"), "unknown key(s) 'colour'"),
        (("max_delegation_depth: 2", "max_delegation_depth: -1"), "max_delegation_depth"),
        (("constraints: {amount_lte: 50000}", "budgets: [{metric: count, limit: 1, window: P1D}]"),
         "'budgets' needs 'schema: ctrlrun.policy/v7'"),
        (("constraints: {amount_lte: 50000}", "tasks: [t]"), "'tasks' needs 'schema: ctrlrun.policy/v7'"),
        (("constraints: {amount_lte: 50000}", "delegable: true"), "needs 'expires_at'"),
    ])
    def test_grant_errors_come_first(self, change: tuple[str, str], fragment: str) -> None:
        refused(doc(self.AUTHORITY.replace(*change), 6), fragment)

    def test_authority_needs_v3(self) -> None:
        refused(doc(self.AUTHORITY, 2), "line 2", "'authority' needs 'schema: ctrlrun.policy/v3'")


@pytest.mark.parametrize("version", range(3, 9))
def test_every_schema_reads_the_features_it_has(version: int) -> None:
    """One document per schema using what it may (and nothing not built): it loads."""
    parts = ["environment: staging", "mode: observe"]
    entry = ["decision: allow", "effect: 'k:{x}'"]
    if version >= 4:
        parts += ["version: v1", "controls: {c: {title: T}}"]
        entry += ["controls: [c]", "data: {x: phi}"]
    if version >= 5:
        entry.append("max_attempts: 3")
    if version >= 6:
        entry.append("approvals_required: 1")
    text = doc("\n".join(parts) + "\nactions:\n  a:\n" + "".join(f"    {line}\n" for line in entry), version)
    policy = parse_policy(text)
    assert policy.mode == "observe" and policy.environment == "staging"
