"""The policy file: loading, validation, evaluation and hashing (reference §1.2-§1.7, §2.4).

Pure layer: no database, no Django.
"""
from __future__ import annotations

import logging
import re
import textwrap
from pathlib import Path

import pytest
import yaml

import ctrlrun.policy as policy_module
import ctrlrun.policy.loader as policy_loader
from ctrlrun.canonical import Template, canonical_bytes, sha256_hash
from ctrlrun.errors import InvalidArgument, PolicyError
from ctrlrun.policy import (
    SUPPORTED_SCHEMAS,
    ActionEntry,
    Condition,
    Evaluation,
    Policy,
    Rule,
    load_policy,
    parse_policy,
)
from ctrlrun.states import Decision

V2 = "schema: ctrlrun.policy/v2\n"

REFERENCE_DOC = """\
schema: ctrlrun.policy/v2
actions:
  stripe.refund:
    effect: "refund:{payment_id}"
    resource: "payment:{payment_id}"
    mcp: { not_executed_on_error: false }
    rules:
      - when: { amount_gte: 0, amount_lte: 50000 }
        decision: allow
      - when: { amount_gte: 0, amount_lte: 1000000 }
        decision: approve
      - decision: deny
  iam.grant_admin:
    decision: deny
"""


def doc(body: str, schema: str = "ctrlrun.policy/v2") -> str:
    """A document with ``schema`` and the dedented ``body`` below it."""
    return f"schema: {schema}\n" + textwrap.dedent(body)


def refused(text: str, *fragments: str, source: str = "<string>") -> str:
    """Parse ``text``, expect a PolicyError starting with the source, containing every fragment."""
    with pytest.raises(PolicyError) as caught:
        parse_policy(text, source)
    message = str(caught.value)
    assert message.startswith(source), message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    return message


def rules_policy(when: str, decision: str = "allow") -> Policy:
    """A policy whose action ``a`` has one rule ``when: <when>`` -> decision."""
    return parse_policy(doc(f"""\
        actions:
          a:
            rules:
              - when: {when}
                decision: {decision}
        """))


def holds(when: str, **arguments: object) -> bool:
    """Whether a one-rule policy allows ``a`` with these arguments."""
    return rules_policy(when).evaluate("a", arguments).decision is Decision.ALLOW


# --------------------------------------------------------------------------------------------
# A good document
# --------------------------------------------------------------------------------------------


class TestReferenceDocument:
    def test_parses_into_entries(self) -> None:
        """The §1.4 example loads: entries, rules, conditions, templates and mcp as written."""
        policy = parse_policy(REFERENCE_DOC)
        assert policy.schema == "ctrlrun.policy/v2"
        assert policy.source == "<string>"
        assert policy.text == REFERENCE_DOC
        assert policy.environment == "production"
        refund = policy.entry("stripe.refund")
        assert isinstance(refund, ActionEntry)
        assert refund.name == "stripe.refund"
        assert refund.decision is None
        assert [rule.index for rule in refund.rules] == [0, 1, 2]
        assert refund.rules[0].when == (
            Condition(key="amount_gte", argument="amount", op="gte", operand=0),
            Condition(key="amount_lte", argument="amount", op="lte", operand=50000),
        )
        assert refund.rules[1].decision is Decision.APPROVE
        assert refund.rules[2].when == ()
        assert refund.effect == Template.parse("refund:{payment_id}")
        assert refund.resource == Template.parse("payment:{payment_id}")
        assert refund.mcp == {"not_executed_on_error": False}
        grant = policy.entry("iam.grant_admin")
        assert grant is not None and grant.decision is Decision.DENY and grant.rules == ()
        assert grant.effect is None and grant.resource is None and grant.mcp is None

    def test_entry_of_unknown_name_is_none(self) -> None:
        """entry() matches names exactly and returns None for anything else."""
        policy = parse_policy(REFERENCE_DOC)
        assert policy.entry("stripe.Refund") is None
        assert policy.entry("stripe") is None

    def test_actions_are_read_only(self) -> None:
        """The actions mapping of a loaded policy cannot be changed."""
        policy = parse_policy(REFERENCE_DOC)
        with pytest.raises(TypeError):
            policy.actions["x"] = policy.actions["stripe.refund"]  # type: ignore[index]

    def test_v1_document_without_templates(self) -> None:
        """A v1 document with rules and bare decisions loads."""
        policy = parse_policy(doc("""\
            actions:
              a: {decision: allow}
              b: {rules: [{decision: approve}]}
            """, "ctrlrun.policy/v1"))
        assert policy.schema == "ctrlrun.policy/v1"
        assert policy.evaluate("b", {}) == Evaluation(Decision.APPROVE, "rule[0]")

    def test_empty_actions_denies_everything(self) -> None:
        """`actions: {}` is legal and every call is an unknown action."""
        policy = parse_policy(V2 + "actions: {}\n")
        assert policy.actions == {}
        assert policy.evaluate("anything", {}) == Evaluation(Decision.DENY, "unknown_action")

    def test_supported_schemas(self) -> None:
        """This version reads v1 to v8."""
        assert SUPPORTED_SCHEMAS == tuple(f"ctrlrun.policy/v{n}" for n in range(1, 9))

    def test_merge_keys_are_not_duplicates(self) -> None:
        """A YAML merge (<<: *anchor) may be overridden by the mapping's own key."""
        policy = parse_policy(doc("""\
            actions:
              a: &base {decision: allow, effect: "x:{id}"}
              b: {<<: *base, decision: deny}
            """))
        b = policy.entry("b")
        assert b is not None and b.decision is Decision.DENY and b.effect == Template.parse("x:{id}")

    def test_environment_is_stripped(self) -> None:
        """The environment given to parse_policy is stripped and kept on the policy."""
        assert parse_policy(REFERENCE_DOC, environment=" staging ").environment == "staging"

    @pytest.mark.parametrize("environment", ["", "   ", 7])
    def test_blank_environment_is_invalid_argument(self, environment: object) -> None:
        """A blank or non-string environment is a wiring mistake, not a policy error (None: not given)."""
        with pytest.raises(InvalidArgument):
            parse_policy(REFERENCE_DOC, environment=environment)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# §1.2 Loading: YAML, duplicates, refused value types, line numbers
# --------------------------------------------------------------------------------------------


class TestYaml:
    def test_duplicate_key_names_line_and_column(self) -> None:
        """A duplicate key is not valid YAML, with its line and column."""
        refused(doc("""\
            actions:
              a: {decision: allow}
              a: {decision: deny}
            """), "<string>: not valid YAML: duplicate key 'a' on line 4, column 3")

    def test_duplicate_key_in_flow_mapping(self) -> None:
        """Duplicates are refused in flow mappings too."""
        refused(doc("""\
            actions:
              a: {decision: allow, decision: deny}
            """), "not valid YAML: duplicate key 'decision' on line 3")

    def test_duplicate_top_level_key(self) -> None:
        """Two `schema:` lines are refused rather than the last silently winning."""
        refused(V2 + V2 + "actions: {}\n", "not valid YAML: duplicate key 'schema' on line 2, column 1")

    def test_syntax_error(self) -> None:
        """A YAML syntax error becomes `<src>: not valid YAML: ...` with a line."""
        refused("schema: ctrlrun.policy/v2\nactions: [\n", "<string>: not valid YAML:", "line 3")

    def test_invalid_date_is_a_yaml_error(self) -> None:
        """A scalar that fails to build (2026-99-99) is not valid YAML."""
        refused(V2 + "actions: {}\nwhen: 2026-99-99\n", "<string>: not valid YAML:", "2026-99-99", "line 3")

    def test_several_documents(self) -> None:
        """A stream of several YAML documents is refused."""
        refused(V2 + "actions: {}\n---\nx: 1\n", "not valid YAML", "single document")

    def test_unknown_tag(self) -> None:
        """An application tag has no constructor in a safe load."""
        refused(V2 + "actions: !!python/object:object {}\n", "not valid YAML")

    def test_empty_document(self) -> None:
        """An empty file is refused, saying what a policy needs."""
        refused("", "<string>: ", "empty", "schema")

    def test_top_level_not_a_mapping(self) -> None:
        """A list at the top level is refused."""
        refused("- schema: ctrlrun.policy/v2\n", "<string>, line 1: ", "mapping", "got list")

    def test_float_refused_with_path_and_line(self) -> None:
        """A float operand is refused naming where it is, with its own line."""
        refused(doc("""\
            actions:
              stripe.refund:
                rules:
                  - when:
                      amount_lte: 500.00
                    decision: allow
            """), "<string>, line 6: ", "actions['stripe.refund'].rules[0].when.amount_lte", "float", "500.00")

    def test_float_refused_outside_actions(self) -> None:
        """Floats are refused anywhere in the document, even in an unknown key."""
        refused(V2 + "actions: {}\nratio: .5\n", "<string>, line 3: ", "ratio", "float")

    def test_float_refused_deep_in_a_list(self) -> None:
        """A float nested inside an `in` operand is found."""
        refused(doc("""\
            actions:
              a:
                rules:
                  - when: {n_in: [1, [2, 2.5]]}
                    decision: allow
            """), "line 5", "n_in[1][1]", "float")

    def test_special_floats_refused(self) -> None:
        """`.nan` and `.inf` are floats too."""
        refused(V2 + "actions: {}\nx: .nan\n", "line 3", "float")
        refused(V2 + "actions: {}\nx: -.inf\n", "line 3", "float")

    def test_binary_refused(self) -> None:
        """`!!binary` is refused, naming the key."""
        refused(doc("""\
            actions:
              a:
                decision: allow
                effect: !!binary aGVsbG8=
            """), "line 5", "actions.a.effect", "!!binary")

    def test_date_refused(self) -> None:
        """A valid date is refused: quote it to make a string."""
        refused(doc("""\
            actions:
              a:
                rules:
                  - when: {day_eq: 2026-01-09}
                    decision: allow
            """), "line 5", "when.day_eq", "date", "quote")

    def test_timestamp_refused(self) -> None:
        """A timestamp is refused."""
        refused(V2 + "actions: {}\nat: 2026-01-09 10:00:00\n", "line 3", "timestamp")

    def test_set_refused(self) -> None:
        """`!!set` is refused."""
        refused(V2 + "actions: {}\nx: !!set {a, b}\n", "line 3", "!!set")

    def test_integer_action_name_refused(self) -> None:
        """A non-string action name is a non-string key."""
        refused(doc("""\
            actions:
              123: {decision: allow}
            """), "<string>, line 3: actions: ", "must be strings", "int", "123")

    def test_boolean_key_refused(self) -> None:
        """`on:` is a bool key in YAML 1.1; refused with a hint to quote it."""
        refused(doc("""\
            actions:
              a:
                rules:
                  - when: {on: 1}
                    decision: allow
            """), "line 5", "must be strings", "bool", "quote")

    def test_null_key_refused(self) -> None:
        """A null key is refused."""
        refused(V2 + "actions: {}\n~: 1\n", "line 3", "must be strings", "None")

    def test_float_key_refused(self) -> None:
        """A float key is refused as a key."""
        refused(V2 + "actions:\n  1.5: {decision: allow}\n", "line 3", "must be strings", "float")

    def test_recursive_alias_refused(self) -> None:
        """An alias pointing at its own ancestor cannot be hashed; refused."""
        refused(V2 + "actions: {}\nx: &loop [*loop]\n", "line 3", "recursive")

    def test_ints_of_any_size_are_fine(self) -> None:
        """Ints are arbitrary precision, in operands and elsewhere."""
        policy = rules_policy("{n_lte: 123456789012345678901234567890}")
        assert policy.evaluate("a", {"n": 123456789012345678901234567889}).decision is Decision.ALLOW
        assert policy.evaluate("a", {"n": 123456789012345678901234567891}).decision is Decision.DENY


class TestLoadPolicy:
    def test_reads_a_file(self, tmp_path: Path) -> None:
        """load_policy reads the file and keeps its path as the source."""
        path = tmp_path / "ctrlrun.yaml"
        path.write_text(REFERENCE_DOC, encoding="utf-8")
        policy = load_policy(path)
        assert policy.source == str(path)
        assert policy.text == REFERENCE_DOC
        assert policy.hash == parse_policy(REFERENCE_DOC).hash

    def test_accepts_a_string_path(self, tmp_path: Path) -> None:
        """A str path works as well as a Path."""
        path = tmp_path / "p.yaml"
        path.write_text(REFERENCE_DOC, encoding="utf-8")
        assert load_policy(str(path)).source == str(path)

    def test_missing_file(self, tmp_path: Path) -> None:
        """A missing file is `policy file <p> could not be read: <err>`."""
        path = tmp_path / "nope.yaml"
        with pytest.raises(PolicyError) as caught:
            load_policy(path)
        assert str(caught.value).startswith(f"policy file {path} could not be read: ")
        assert "No such file" in str(caught.value)

    def test_directory_is_unreadable(self, tmp_path: Path) -> None:
        """A directory is not a readable policy file."""
        with pytest.raises(PolicyError, match="could not be read"):
            load_policy(tmp_path)

    def test_not_utf8_is_unreadable(self, tmp_path: Path) -> None:
        """Bytes that are not UTF-8 are reported as unreadable, not as a crash."""
        path = tmp_path / "latin1.yaml"
        path.write_bytes(b"schema: ctrlrun.policy/v2\nactions: {caf\xe9: {decision: allow}}\n")
        with pytest.raises(PolicyError, match="could not be read"):
            load_policy(path)

    def test_errors_name_file_line_and_key(self, tmp_path: Path) -> None:
        """A malformed file names the path, the line and the key (what `manage.py check` shows)."""
        path = tmp_path / "ctrlrun.yaml"
        path.write_text(doc("""\
            actions:
              stripe.refund:
                rules:
                  - decision: allow
                  - when: {amount_lte: 1}
                    decision: allow
                  - when:
                      amount_gte: "100"
                    decision: deny
            """), encoding="utf-8")
        with pytest.raises(PolicyError) as caught:
            load_policy(path)
        message = str(caught.value)
        assert message.startswith(f"{path}, line 9: action 'stripe.refund' rule[2]: condition 'amount_gte': ")
        assert "needs an int operand, got str" in message
        assert caught.value.source == str(path)  # type: ignore[attr-defined]
        assert caught.value.line == 9  # type: ignore[attr-defined]

    def test_yaml_error_names_the_file(self, tmp_path: Path) -> None:
        """A YAML error in a file starts with the path."""
        path = tmp_path / "ctrlrun.yaml"
        path.write_text(V2 + "actions:\n  a: 1\n  a: 2\n", encoding="utf-8")
        with pytest.raises(PolicyError) as caught:
            load_policy(path)
        assert str(caught.value).startswith(f"{path}: not valid YAML: duplicate key 'a' on line 4, column 3")


# --------------------------------------------------------------------------------------------
# Hostile input: size, aliases and merges, depth, integer spellings, characters
# --------------------------------------------------------------------------------------------


@pytest.fixture(params=["libyaml", "python"])
def parser(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run the test with libyaml's parser and with the pure-Python fallback."""
    if request.param == "libyaml" and not yaml.__with_libyaml__:
        pytest.skip("PyYAML was built without libyaml")
    monkeypatch.setattr(policy_loader, "_USE_LIBYAML", request.param == "libyaml")
    return request.param


def list_bomb(levels: int, width: int = 9) -> str:
    """A "billion laughs" document: each anchored list holds ``width`` aliases of the one before."""
    lines = ["schema: ctrlrun.policy/v2", "actions: {}", 'a0: &a0 ["lol"]']
    for level in range(1, levels):
        lines.append(f"a{level}: &a{level} [{', '.join([f'*a{level - 1}'] * width)}]")
    return "\n".join(lines) + "\n"


def merge_bomb(keys: int, mappings: int, width: int = 9) -> str:
    """Many mappings each merging (``<<: [*b, *b, ...]``) one wide anchored mapping."""
    lines = ["schema: ctrlrun.policy/v2", "actions: {}"]
    lines.append("base: &b {" + ", ".join(f"k{i}: 1" for i in range(keys)) + "}")
    lines.append("copies:")
    lines.extend(f"  - {{<<: [{', '.join(['*b'] * width)}]}}" for _ in range(mappings))
    return "\n".join(lines) + "\n"


def nested_in_operand(depth: int) -> str:
    """A valid policy whose `n_in` operand nests lists until the document is ``depth`` levels deep."""
    # top level, actions, entry, rules, rule, when, operand: the operand list is level 7
    inner = depth - 6
    return doc(f"""\
        actions:
          a:
            rules:
              - when: {{n_in: {"[" * inner + "1" + "]" * inner}}}
                decision: allow
        """)


class TestSizeLimit:
    def test_text_over_the_limit_is_refused_before_parsing(self) -> None:
        """A document longer than MAX_POLICY_BYTES is refused by size, naming the limit."""
        limit = policy_module.MAX_POLICY_BYTES
        text = REFERENCE_DOC + "#" * limit + "\n"
        message = refused(text, "<string>: ", f"{len(text.encode()):,} bytes", f"{limit:,}")
        assert "not valid YAML" not in message

    def test_size_is_counted_in_utf8_bytes(self) -> None:
        """Two-byte characters count twice: the limit is on the stored bytes, not on characters."""
        limit = policy_module.MAX_POLICY_BYTES
        text = REFERENCE_DOC + "# " + "é" * (limit // 2) + "\n"
        assert len(text) < limit < len(text.encode())
        refused(text, "bytes", f"{limit:,}")

    def test_document_at_the_limit_loads(self) -> None:
        """A valid document of exactly MAX_POLICY_BYTES bytes loads."""
        limit = policy_module.MAX_POLICY_BYTES
        text = REFERENCE_DOC + "#" * (limit - len(REFERENCE_DOC) - 1) + "\n"
        assert len(text.encode()) == limit
        assert parse_policy(text).entry("iam.grant_admin") is not None

    def test_oversized_file_is_refused_by_its_size(self, tmp_path: Path) -> None:
        """A file over the limit (here 64 MB of NULs) is refused by its size, naming the path and the limit."""
        path = tmp_path / "ctrlrun.yaml"
        with open(path, "wb") as handle:
            handle.truncate(64 << 20)
        with pytest.raises(PolicyError) as caught:
            load_policy(path)
        message = str(caught.value)
        assert message.startswith(f"{path}: "), message
        assert f"{64 << 20:,} bytes" in message and f"{policy_module.MAX_POLICY_BYTES:,}" in message

    def test_file_keeps_universal_newlines(self, tmp_path: Path) -> None:
        """CRLF line ends in a file are read as newlines, as text mode did (the stored text is unchanged)."""
        path = tmp_path / "ctrlrun.yaml"
        path.write_bytes(REFERENCE_DOC.replace("\n", "\r\n").encode())
        assert load_policy(path).text == REFERENCE_DOC


class TestAliasesAndMerges:
    def test_alias_bomb_is_refused(self, parser: str) -> None:
        """Nested aliases of lists that expand past MAX_POLICY_NODES are refused at the alias's line."""
        text = list_bomb(levels=7)  # 9**6 = 531,441 items once expanded, from 378 bytes
        message = refused(text, "<string>, line 9: ", "expand", "aliases")
        assert f"{policy_module.MAX_POLICY_NODES:,}" in message

    def test_merge_key_bomb_is_refused(self, parser: str) -> None:
        """Merge keys copying a wide mapping into many mappings are refused once past the budget."""
        text = merge_bomb(keys=2000, mappings=1000)  # 2,000,000 merged pairs from 90 KB
        refused(text, "<string>, line ", "expand", "merge")

    def test_merge_of_itself_is_refused(self, parser: str) -> None:
        """A mapping that merges itself cannot be expanded; refused with its line."""
        refused(V2 + "actions: {}\nx: &x {<<: *x, k: 1}\n", "line 3", "merge")

    def test_modest_aliases_load(self, parser: str) -> None:
        """An anchored operand reused by several rules is read as the same value each time."""
        policy = parse_policy(doc("""\
            actions:
              a:
                rules:
                  - when: {region_in: &regions [eu, us, apac]}
                    decision: allow
                  - when: {fallback_in: *regions}
                    decision: approve
              b: &plain {decision: deny}
              c: *plain
            """))
        assert policy.evaluate("a", {"region": "us"}).decision is Decision.ALLOW
        assert policy.evaluate("a", {"fallback": "apac"}).decision is Decision.APPROVE
        assert policy.evaluate("c", {}).decision is Decision.DENY

    def test_merge_keys_override_and_order(self, parser: str) -> None:
        """`<<: [*first, *second]`: the first mapping wins over the second, the own key over both."""
        policy = parse_policy(doc("""\
            actions:
              a: &first {decision: allow, effect: "first:{id}"}
              b: &second {decision: approve, effect: "second:{id}", resource: "r:{id}"}
              c: {<<: [*first, *second]}
              d: {<<: [*first, *second], decision: deny}
            """))
        c, d = policy.entry("c"), policy.entry("d")
        assert c is not None and d is not None
        assert (c.decision, c.effect, c.resource) == (
            Decision.ALLOW, Template.parse("first:{id}"), Template.parse("r:{id}"))
        assert d.decision is Decision.DENY and d.effect == Template.parse("first:{id}")

    def test_merge_source_defined_inline_then_aliased(self, parser: str) -> None:
        """A merge source anchored inside a merge and aliased later keeps its own keys (no false duplicate)."""
        policy = parse_policy(doc("""\
            actions:
              a: &a {decision: allow, effect: "a:{id}"}
              b: {<<: &b {<<: *a, decision: deny}}
              c: *b
            """))
        c = policy.entry("c")
        assert c is not None and c.decision is Decision.DENY and c.effect == Template.parse("a:{id}")

    def test_duplicate_own_key_beside_a_merge_is_refused(self, parser: str) -> None:
        """Merged keys may be overridden, but a mapping's own key twice is still a duplicate."""
        refused(doc("""\
            actions:
              a: &a {decision: allow}
              b: {<<: *a, decision: deny, decision: allow}
            """), "duplicate key 'decision' on line 4")


    def test_dense_document_over_the_node_limit_is_refused(self) -> None:
        """A document within the byte limit but with more than MAX_POLICY_NODES nodes is refused."""
        limit = policy_module.MAX_POLICY_NODES
        text = V2 + "actions: {}\nx: [" + "1," * limit + "1]\n"
        assert len(text.encode()) <= policy_module.MAX_POLICY_BYTES
        refused(text, "<string>, line 3: ", f"more than {limit:,} nodes", "shorten")

    def test_large_realistic_policy_loads(self, parser: str) -> None:
        """A policy of 1,000 actions, the size the limits are measured against, loads whole."""
        entries = "".join(
            f"  svc{n}.refund:\n"
            f'    effect: "refund{n}:{{payment_id}}"\n'
            f"    rules:\n"
            f"      - when: {{amount_gte: 0, amount_lte: 50000, currency_in: [usd, eur]}}\n"
            f"        decision: allow\n"
            f"      - when: {{amount_gte: 0, amount_lte: 1000000}}\n"
            f"        decision: approve\n"
            f"      - decision: deny\n"
            for n in range(1000)
        )
        policy = parse_policy(V2 + "actions:\n" + entries)
        assert len(policy.actions) == 1000
        assert policy.evaluate("svc999.refund", {"amount": 2000, "currency": "eur"}).decision is Decision.ALLOW


class TestCollector:
    def test_collector_is_switched_back_on(self) -> None:
        """parse_policy pauses the cyclic garbage collector and turns it back on, after a refusal too."""
        import gc

        assert gc.isenabled()
        parse_policy(REFERENCE_DOC)
        assert gc.isenabled()
        with pytest.raises(PolicyError):
            parse_policy(list_bomb(levels=7))
        assert gc.isenabled()

    def test_collector_left_off_when_it_was_off(self) -> None:
        """A caller that switched the collector off finds it still off."""
        import gc

        gc.disable()
        try:
            parse_policy(REFERENCE_DOC)
            assert not gc.isenabled()
        finally:
            gc.enable()


class TestDepth:
    def test_depth_at_the_limit_loads(self, parser: str) -> None:
        """A document exactly MAX_POLICY_DEPTH levels deep loads."""
        policy = parse_policy(nested_in_operand(policy_module.MAX_POLICY_DEPTH))
        assert policy.entry("a") is not None

    def test_one_level_deeper_is_refused(self, parser: str) -> None:
        """One level past MAX_POLICY_DEPTH is refused, naming the line and the limit."""
        depth = policy_module.MAX_POLICY_DEPTH
        refused(nested_in_operand(depth + 1), "<string>, line 5: ", "nested", f"{depth} levels")

    def test_depth_reached_through_an_alias_is_refused(self, parser: str) -> None:
        """An alias whose target is deep counts at the depth where it is used."""
        depth = policy_module.MAX_POLICY_DEPTH
        deep = "[" * (depth - 2) + "1" + "]" * (depth - 2)  # at top-level key: levels 2..depth-1
        refused(V2 + f"actions: {{}}\nx: &d {deep}\ny: [[*d]]\n", "<string>, line 4: ", "nested")

    def test_extremely_deep_nesting_is_a_policy_error(self, parser: str) -> None:
        """100,000 open brackets are a PolicyError (never a RecursionError or a crash)."""
        refused(V2 + "actions: {}\nx: " + "[" * 100_000 + "\n", "<string>", "nest")


class TestIntegerSpellings:
    @pytest.mark.parametrize(
        ("spelling", "value", "kind"),
        [
            ("010", 8, "octal"),
            ("-010", -8, "octal"),
            ("0o7", 7, "octal"),
            ("0x10", 16, "hexadecimal"),
            ("0b11", 3, "binary"),
            ("1:30", 90, "sexagesimal"),
            ("1_000", 1000, "_"),
            ("!!int 010", 8, "octal"),
        ],
    )
    def test_non_decimal_int_refused(self, parser: str, spelling: str, value: int, kind: str) -> None:
        """A YAML 1.1/1.2 int that is not plain decimal is refused, saying what it would have been."""
        message = refused(
            rules_policy_text(f"{{n_eq: {spelling}}}"),
            "<string>, line 5: ", "when.n_eq", kind, f"as {value}", f"write {value}", "quote",
        )
        assert "not valid YAML" not in message

    def test_non_decimal_int_key_refused(self, parser: str) -> None:
        """An octal-looking action name is refused as a non-string key, showing how it was written."""
        refused(doc("""\
            actions:
              0x10: {decision: allow}
            """), "<string>, line 3: actions: ", "must be strings", "0x10", "quote")

    @pytest.mark.parametrize(("spelling", "value"), [("16", 16), ("+16", 16), ("-5", -5), ("0", 0), ("-0", 0)])
    def test_plain_decimal_ints_are_ints(self, parser: str, spelling: str, value: int) -> None:
        """Plain decimal integers, with an optional sign, are still ints."""
        assert rules_policy(f"{{n_lte: {spelling}}}").evaluate("a", {"n": value}).decision is Decision.ALLOW
        assert rules_policy(f"{{n_lte: {spelling}}}").evaluate("a", {"n": value + 1}).decision is Decision.DENY

    def test_quoted_spellings_are_strings(self, parser: str) -> None:
        """Quoted, the same spellings are strings, compared as written."""
        policy = rules_policy('{n_in: ["010", "0x10", "1:30", "0o7"]}')
        assert policy.evaluate("a", {"n": "1:30"}).decision is Decision.ALLOW
        assert policy.evaluate("a", {"n": 90}).decision is Decision.DENY


def rules_policy_text(when: str) -> str:
    """The text of :func:`rules_policy` (its `when` is on line 5)."""
    return doc(f"""\
        actions:
          a:
            rules:
              - when: {when}
                decision: allow
        """)


class TestCharacters:
    @pytest.mark.parametrize(
        ("char", "shown"),
        [("\x00", "U+0000"), ("\x01", "U+0001"), ("\x1b", "U+001B"), ("\x7f", "U+007F"), ("\x85", "U+0085"),
         ("\x9f", "U+009F"), ("\x0b", "U+000B"), ("\ufffe", "U+FFFE")],
    )
    def test_raw_control_character_refused(self, parser: str, char: str, shown: str) -> None:
        """A control character in the text is a PolicyError naming line and column, not a reader crash."""
        refused(V2 + f"actions: {{}}\nnote: ab{char}c\n", "<string>, line 3: ", "column 9", shown)

    def test_raw_lone_surrogate_refused(self, parser: str) -> None:
        """A lone surrogate in the text given to parse_policy is a PolicyError with its line."""
        refused(V2 + "actions: {}\nnote: \ud800\n", "<string>, line 3: ", "U+D800", "surrogate")

    def test_nul_byte_in_a_file_refused(self, tmp_path: Path) -> None:
        """A NUL byte in a policy file is refused naming the file and the line."""
        path = tmp_path / "ctrlrun.yaml"
        path.write_bytes(REFERENCE_DOC.encode() + b"note: a\x00b\n")
        with pytest.raises(PolicyError) as caught:
            load_policy(path)
        assert str(caught.value).startswith(f"{path}, line 15: "), str(caught.value)
        assert "U+0000" in str(caught.value)

    @pytest.mark.parametrize(
        "entry", ['a: {decision: allow, effect: "x\\ud800:{id}"}', '"a\\ud800": {decision: allow}']
    )
    def test_escaped_lone_surrogate_refused(self, parser: str, entry: str) -> None:
        """A double-quoted "\\ud800" escape in an action name or a value is refused with its line."""
        message = refused(V2 + f"actions:\n  {entry}\n", "<string>", "line 3", "escape")
        assert "cannot be hashed" not in message

    @pytest.mark.parametrize(
        ("escape", "shown"),
        [("\\0", "U+0000"), ("\\x01", "U+0001"), ("\\e", "U+001B"), ("\\a", "U+0007"), ("\\x7f", "U+007F"),
         ("\\N", "U+0085"), ("\\u009b", "U+009B")],
    )
    def test_escaped_control_character_refused(self, parser: str, escape: str, shown: str) -> None:
        """A control character written as an escape in a string is refused naming the line and the key."""
        text = doc(f"""\
            actions:
              a:
                decision: allow
                effect: "refund{escape}:{{id}}"
            """)
        refused(text, "<string>, line 5: ", "actions.a.effect", shown)

    def test_escaped_control_character_in_key_refused(self, parser: str) -> None:
        """A control character escaped into an action name is refused."""
        refused(V2 + 'actions:\n  "stripe\\0refund": {decision: allow}\n', "<string>, line 3: ", "U+0000")

    def test_tab_newline_and_carriage_return_allowed(self, parser: str) -> None:
        """Tab, newline and carriage return escapes are ordinary string content."""
        policy = rules_policy('{note_eq: "a\\tb\\nc\\rd"}')
        assert policy.evaluate("a", {"note": "a\tb\nc\rd"}).decision is Decision.ALLOW

    @pytest.mark.parametrize("char", ["\u202e", "\u2066", "\u2069", "\u200b", "\u200f", "\ufeff", "\u00ad"])
    def test_format_character_in_action_name_refused(self, parser: str, char: str) -> None:
        """An invisible or bidi format character (category Cf) in an action name is refused."""
        code = f"U+{ord(char):04X}"
        refused(V2 + f"actions:\n  stripe{char}.refund: {{decision: allow}}\n", "<string>, line 3: ", code)
        escaped = f"\\u{ord(char):04x}"
        refused(V2 + f'actions:\n  "stripe{escaped}.refund": {{decision: allow}}\n', "<string>, line 3: ", code)

    def test_format_character_in_condition_key_refused(self, parser: str) -> None:
        """A format character in a condition key (a mapping key) is refused too."""
        refused(rules_policy_text('{"amount\\u200b_lte": 5}'), "<string>, line 5: ", "U+200B")

    def test_leading_byte_order_mark_allowed(self, parser: str) -> None:
        """A byte order mark at the very start of the text is not part of the document."""
        assert parse_policy("\ufeff" + REFERENCE_DOC).hash == parse_policy(REFERENCE_DOC).hash

    def test_non_ascii_names_allowed(self, parser: str) -> None:
        """Letters outside ASCII are fine in names and values."""
        policy = parse_policy(V2 + 'actions:\n  zahlung.rückerstattung: {decision: allow, effect: "ré:{id}"}\n')
        assert policy.entry("zahlung.rückerstattung") is not None


# --------------------------------------------------------------------------------------------
# §1.3 Schema versions
# --------------------------------------------------------------------------------------------


class TestSchema:
    def test_missing_schema(self) -> None:
        """No `schema:` is an unknown schema None, listing the supported ones."""
        refused("actions: {}\n", "unknown policy schema None, expected one of ctrlrun.policy/v1, ctrlrun.policy/v2")

    @pytest.mark.parametrize("schema", ["ctrlrun.policy/v9", "ctrlrun.policy/V2", "ctrlrun.policy", "'v2'", "2"])
    def test_unknown_schema(self, schema: str) -> None:
        """Anything but an exact known schema string is unknown, with the line."""
        refused(f"schema: {schema}\nactions: {{}}\n", "<string>, line 1: ", "unknown policy schema", "expected one of")

    def test_unknown_schema_quotes_the_value(self) -> None:
        """The message shows the value as written."""
        refused("schema: x\nactions: {}\n", "unknown policy schema 'x'")

    @pytest.mark.parametrize("number", range(3, 9))
    def test_later_schemas_read(self, number: int) -> None:
        """A v3..v8 document with v2's features loads; its schema is kept."""
        policy = parse_policy(f"schema: ctrlrun.policy/v{number}\nactions: {{a: {{decision: allow}}}}\n")
        assert policy.schema == f"ctrlrun.policy/v{number}"
        assert policy.evaluate("a", {}).decision is Decision.ALLOW

    @pytest.mark.parametrize(
        ("key", "value", "needed"),
        [
            ("environment", "staging", 3),
            ("authority", "{}", 3),
            ("mode", "enforce", 3),
            ("version", "7", 4),
            ("controls", "{}", 4),
        ],
    )
    def test_top_level_key_of_a_later_schema(self, key: str, value: str, needed: int) -> None:
        """A top-level key from a later schema names the schema it needs, with its line."""
        refused(
            V2 + f"actions: {{}}\n{key}: {value}\n",
            "<string>, line 3: top level: ",
            f"'{key}' needs 'schema: ctrlrun.policy/v{needed}'",
            "declares 'ctrlrun.policy/v2'",
        )

    @pytest.mark.parametrize(
        ("key", "value", "needed"),
        [
            ("controls", "[c1]", 4),
            ("data", "{}", 4),
            ("max_attempts", "3", 5),
            ("approvals_required", "2", 6),
            ("upstream", "{}", 8),
        ],
    )
    def test_entry_key_of_a_later_schema(self, key: str, value: str, needed: int) -> None:
        """An entry key from a later schema names the schema it needs and the line."""
        refused(
            doc(f"""\
                actions:
                  a:
                    decision: allow
                    {key}: {value}
                """),
            "<string>, line 5: action 'a': ",
            f"'{key}' needs 'schema: ctrlrun.policy/v{needed}'",
        )

    def test_rule_controls_needs_v4(self) -> None:
        """`controls` citations on a rule need v4."""
        refused(doc("""\
            actions:
              a:
                rules:
                  - decision: allow
                    controls: [c1]
            """), "<string>, line 6: action 'a' rule[0]: ", "'controls' needs 'schema: ctrlrun.policy/v4'")

    def test_policy_change_action_needs_v6(self) -> None:
        """The action name `ctrlrun.policy.change` belongs to v6."""
        refused(doc("""\
            actions:
              ctrlrun.policy.change: {decision: approve}
            """), "line 3", "ctrlrun.policy.change", "ctrlrun.policy/v6")

    @pytest.mark.parametrize("key, value", [("effect", "'e:{x}'"), ("resource", "'r:{x}'"), ("mcp", "{}")])
    def test_v2_keys_refused_under_v1(self, key: str, value: str) -> None:
        """effect/resource/mcp under v1 are refused, naming v2."""
        refused(
            doc(f"""\
                actions:
                  a:
                    decision: allow
                    {key}: {value}
                """, "ctrlrun.policy/v1"),
            "<string>, line 5: action 'a': ",
            f"'{key}' needs 'schema: ctrlrun.policy/v2'",
            "declares 'ctrlrun.policy/v1'",
        )


# --------------------------------------------------------------------------------------------
# §1.4 Refusals of a v2 document
# --------------------------------------------------------------------------------------------


class TestStructure:
    def test_unknown_top_level_key_lists_allowed(self) -> None:
        """An unknown top-level key lists the allowed ones."""
        refused(
            V2 + "action: {}\n",
            "<string>, line 2: top level: unknown key(s) 'action'; allowed: actions, authority, controls, "
            "environment, mode, schema, version",
        )

    def test_actions_missing(self) -> None:
        """No `actions:` -> must be a mapping, got NoneType."""
        refused(V2, "'actions' must be a mapping of action name to entry, got NoneType")

    def test_actions_empty_value(self) -> None:
        """`actions:` with no value is None, with its line."""
        refused(V2 + "actions:\n", "<string>, line 2: ", "got NoneType")

    def test_actions_is_a_list(self) -> None:
        """A list of actions is refused."""
        refused(V2 + "actions: [a, b]\n", "line 2", "'actions' must be a mapping", "got list")

    def test_empty_action_name(self) -> None:
        """An empty action name is refused."""
        refused(V2 + "actions:\n  '': {decision: allow}\n", "line 3", "non-empty")

    @pytest.mark.parametrize("value", ["allow", "", "[allow]"])
    def test_entry_not_a_mapping(self, value: str) -> None:
        """An entry must be a mapping."""
        refused(V2 + f"actions:\n  a: {value}\n", "<string>, line 3: action 'a': ", "must be a mapping")

    def test_entry_with_both(self) -> None:
        """`decision` and `rules` together are refused."""
        refused(doc("""\
            actions:
              a:
                decision: allow
                rules: [{decision: deny}]
            """), "<string>, line 3: action 'a': entry must have exactly one of 'decision' or 'rules'")

    def test_entry_with_neither(self) -> None:
        """An entry with only an effect is refused."""
        refused(doc("""\
            actions:
              a:
                effect: "e:{x}"
            """), "action 'a': entry must have exactly one of 'decision' or 'rules'")

    def test_unknown_entry_key_lists_allowed(self) -> None:
        """An unknown entry key names itself and lists the allowed keys."""
        message = refused(doc("""\
            actions:
              a:
                decision: allow
                efect: "e:{x}"
            """), "<string>, line 5: action 'a': unknown key(s) 'efect'; allowed: ")
        for key in ("decision", "rules", "effect", "resource", "mcp"):
            assert key in message

    @pytest.mark.parametrize("value", ["maybe", "Allow", "ALLOW", "'allow '"])
    def test_unknown_decision(self, value: str) -> None:
        """Only the exact strings allow, approve, deny are decisions."""
        refused(V2 + f"actions:\n  a: {{decision: {value}}}\n", "<string>, line 3: action 'a': unknown decision", "allow, approve, deny")

    def test_unknown_decision_quotes_value(self) -> None:
        """The message shows the bad decision."""
        refused(V2 + "actions:\n  a: {decision: maybe}\n", "unknown decision 'maybe'")

    @pytest.mark.parametrize(("value", "kind"), [("yes", "bool"), ("true", "bool"), ("1", "int"), ("~", "NoneType")])
    def test_non_string_decision(self, value: str, kind: str) -> None:
        """A YAML `yes` is a bool, not a decision."""
        refused(V2 + f"actions:\n  a: {{decision: {value}}}\n", "unknown decision", f"got {kind}")

    def test_rule_decision_checked(self) -> None:
        """A rule's decision is checked the same way, with the rule's location."""
        refused(doc("""\
            actions:
              a:
                rules:
                  - decision: allow
                  - decision: perhaps
            """), "<string>, line 6: action 'a' rule[1]: unknown decision 'perhaps'")

    def test_empty_rules(self) -> None:
        """`rules: []` is refused."""
        refused(V2 + "actions:\n  a: {rules: []}\n", "line 3", "action 'a'", "'rules'", "empty")

    def test_rules_not_a_list(self) -> None:
        """`rules` must be a list."""
        refused(V2 + "actions:\n  a: {rules: {decision: allow}}\n", "'rules' must be a non-empty list", "got dict")

    def test_rule_not_a_mapping(self) -> None:
        """A rule must be a mapping."""
        refused(V2 + "actions:\n  a:\n    rules:\n      - allow\n", "<string>, line 5: action 'a' rule[0]: ", "got str")

    def test_rule_without_decision(self) -> None:
        """A rule without a decision is refused, at the rule's line."""
        refused(doc("""\
            actions:
              a:
                rules:
                  - decision: allow
                    when: {n_eq: 1}
                  - when: {n_eq: 2}
            """), "<string>, line 7: action 'a' rule[1]: ", "needs a 'decision'")

    def test_empty_when(self) -> None:
        """`when: {}` is refused (leave it out for an always-matching rule)."""
        refused(doc("""\
            actions:
              a:
                rules:
                  - when: {}
                    decision: allow
            """), "<string>, line 5: action 'a' rule[0]: ", "'when' must be a non-empty mapping")

    @pytest.mark.parametrize("value", ["", "[n_eq]", "n_eq"])
    def test_when_not_a_mapping(self, value: str) -> None:
        """`when` must be a mapping of conditions."""
        refused(V2 + f"actions:\n  a:\n    rules:\n      - when: {value}\n        decision: allow\n",
                "line 5", "'when' must be a non-empty mapping")

    def test_unknown_rule_key(self) -> None:
        """A rule has a closed key set too."""
        refused(doc("""\
            actions:
              a:
                rules:
                  - decision: allow
                    if: {n_eq: 1}
            """), "<string>, line 6: action 'a' rule[0]: unknown key(s) 'if'; allowed: controls, decision, when")

    def test_mode_in_an_entry(self) -> None:
        """`mode:` is refused anywhere but the top level."""
        refused(V2 + "actions:\n  a:\n    decision: allow\n    mode: observe\n",
                "<string>, line 5: action 'a': ", "'mode'", "top level")

    def test_mode_in_a_rule(self) -> None:
        """`mode:` in a rule is refused too."""
        refused(V2 + "actions:\n  a:\n    rules:\n      - decision: allow\n        mode: observe\n",
                "line 6", "rule[0]", "'mode'", "top level")

    @pytest.mark.parametrize("value", ["1", "'no'", "~", "[true]"])
    def test_mcp_flag_must_be_bool(self, value: str) -> None:
        """`mcp.not_executed_on_error` must be a bool."""
        refused(V2 + f"actions:\n  a:\n    decision: allow\n    mcp:\n      not_executed_on_error: {value}\n",
                "<string>, line 6: action 'a' mcp: ", "not_executed_on_error", "true or false")

    def test_mcp_unknown_key(self) -> None:
        """`mcp` has a closed key set."""
        refused(V2 + "actions:\n  a:\n    decision: allow\n    mcp: {retry: true}\n",
                "line 5", "unknown key(s) 'retry'; allowed: not_executed_on_error")

    def test_mcp_not_a_mapping(self) -> None:
        """`mcp` must be a mapping."""
        refused(V2 + "actions:\n  a:\n    decision: allow\n    mcp: true\n", "line 5", "'mcp' must be a mapping")

    def test_mcp_empty_is_fine(self) -> None:
        """An empty `mcp` mapping is kept as an empty dict."""
        policy = parse_policy(V2 + "actions:\n  a: {decision: allow, mcp: {}}\n")
        entry = policy.entry("a")
        assert entry is not None and entry.mcp == {}


# --------------------------------------------------------------------------------------------
# §2.4 Templates
# --------------------------------------------------------------------------------------------


class TestTemplates:
    @pytest.mark.parametrize("key", ["effect", "resource"])
    def test_invalid_template(self, key: str) -> None:
        """A malformed template is a PolicyError with line, key and the template's own message."""
        refused(
            V2 + f"actions:\n  a:\n    decision: allow\n    {key}: 'e:{{x'\n",
            f"<string>, line 5: action 'a' {key}: ",
            "'e:{x' is not a valid template",
            "position 2",
        )

    @pytest.mark.parametrize("value", ["''", "~", "5", "'{0}'", "'{a.b}'", "'x{{y}}'", "'x}'", "'{x:>3}'"])
    def test_other_bad_templates(self, value: str) -> None:
        """Empty, non-string, positional, dotted, doubled and formatted templates are refused."""
        refused(V2 + f"actions:\n  a:\n    decision: allow\n    effect: {value}\n", "line 5", "action 'a' effect")

    def test_effect_policy_prefix_reserved(self) -> None:
        """An effect starting `policy:` is reserved."""
        refused(V2 + "actions:\n  a:\n    decision: allow\n    effect: 'policy:{x}'\n",
                "<string>, line 5: action 'a' effect: ", "'policy:'", "reserved")

    def test_resource_policy_prefix_allowed(self) -> None:
        """Only effects are reserved under `policy:`; a resource may use it."""
        entry = parse_policy(V2 + "actions:\n  a:\n    decision: allow\n    resource: 'policy:{x}'\n").entry("a")
        assert entry is not None and entry.resource == Template.parse("policy:{x}")

    @pytest.mark.parametrize("key", ["effect", "resource"])
    def test_policy_change_in_template_reserved(self, key: str) -> None:
        """A template mentioning ctrlrun.policy.change is reserved."""
        refused(V2 + f"actions:\n  a:\n    decision: allow\n    {key}: 'x:ctrlrun.policy.change:{{id}}'\n",
                "line 5", "ctrlrun.policy.change", "reserved")

    def test_good_templates_parsed(self) -> None:
        """Valid templates are kept as parsed Template objects."""
        entry = parse_policy(V2 + "actions:\n  a:\n    decision: allow\n    effect: 'mail:{to}:{_id2}'\n").entry("a")
        assert entry is not None and entry.effect is not None
        assert entry.effect.names == ("to", "_id2")


# --------------------------------------------------------------------------------------------
# §1.6 Conditions: grammar and operands
# --------------------------------------------------------------------------------------------


class TestConditionGrammar:
    @pytest.mark.parametrize(
        ("key", "argument", "op"),
        [
            ("amount_neq", "amount", "neq"),
            ("x_neq_eq", "x_neq", "eq"),
            ("amount_lte", "amount", "lte"),
            ("amount_gte", "amount", "gte"),
            ("amount_lt", "amount", "lt"),
            ("amount_gt", "amount", "gt"),
            ("currency_in", "currency", "in"),
            ("to_eq", "to", "eq"),
            ("a_b_c_eq", "a_b_c", "eq"),
            ("x_in_lt", "x_in", "lt"),
            ("_x_eq", "_x", "eq"),
        ],
    )
    def test_split_at_longest_suffix(self, key: str, argument: str, op: str) -> None:
        """The key splits at the longest `_<op>` suffix."""
        operand = "[1]" if op == "in" else "1"
        rule = rules_policy(f"{{{key}: {operand}}}").actions["a"].rules[0]
        assert (rule.when[0].key, rule.when[0].argument, rule.when[0].op) == (key, argument, op)

    @pytest.mark.parametrize("key", ["x_like", "_eq", "eq", "amount", "amount_", "amount_EQ", "amount-eq"])
    def test_bad_condition_key(self, key: str) -> None:
        """A key without a known `_<op>` suffix, or with an empty argument, is refused listing the ops."""
        refused(
            V2 + f"actions:\n  a:\n    rules:\n      - decision: allow\n        when:\n          n_eq: 1\n          {key}: 1\n",
            "<string>, line 8: action 'a' rule[0]: ",
            f"condition '{key}' must be '<argument>_<op>' where op is one of eq, gt, gte, in, lt, lte, neq",
        )

    @pytest.mark.parametrize(
        "subject",
        ["action_id", "agent", "claims", "environment", "expires_at", "issuer", "principal", "resource", "user"],
    )
    def test_reserved_subjects(self, subject: str) -> None:
        """A condition on an Action field is refused: it is not an argument."""
        refused(
            V2 + f"actions:\n  a:\n    rules:\n      - when: {{{subject}_eq: x}}\n        decision: allow\n",
            "<string>, line 5: action 'a' rule[0]: ",
            f"condition '{subject}_eq' names the Action field '{subject}'",
            "not an argument",
        )

    def test_data_scope_needs_v4(self) -> None:
        """`data_scope` is a derived subject of v4."""
        refused(
            V2 + "actions:\n  a:\n    rules:\n      - when: {data_scope_in: [pii]}\n        decision: allow\n",
            "line 5", "data_scope", "ctrlrun.policy/v4",
        )

    def test_reserved_name_as_part_of_argument_is_fine(self) -> None:
        """Only the exact field names are reserved: `user_id_eq` tests the argument user_id."""
        assert holds("{user_id_eq: u1}", user_id="u1")

    @pytest.mark.parametrize("op", ["lt", "lte", "gt", "gte"])
    @pytest.mark.parametrize(("value", "kind"), [("'100'", "str"), ("true", "bool"), ("~", "NoneType"), ("[1]", "list"), ("{a: 1}", "dict")])
    def test_numeric_operand_must_be_int(self, op: str, value: str, kind: str) -> None:
        """lt/lte/gt/gte take a real int only."""
        refused(
            V2 + f"actions:\n  a:\n    rules:\n      - when: {{n_{op}: {value}}}\n        decision: allow\n",
            f"<string>, line 5: action 'a' rule[0]: condition 'n_{op}': ",
            f"a numeric operator needs an int operand, got {kind}",
        )

    def test_numeric_operand_shows_the_value(self) -> None:
        """The refused scalar operand is shown."""
        refused(V2 + "actions:\n  a:\n    rules:\n      - when: {n_lte: '100'}\n        decision: allow\n", "got str ('100')")

    @pytest.mark.parametrize("value", ["1", "x", "~", "{a: 1}", "true"])
    def test_in_operand_must_be_a_list(self, value: str) -> None:
        """`in` takes a list."""
        refused(V2 + f"actions:\n  a:\n    rules:\n      - when: {{n_in: {value}}}\n        decision: allow\n",
                "line 5", "condition 'n_in'", "'in' needs a list operand")

    def test_in_items_may_be_containers(self) -> None:
        """`in` items may be scalars, lists or maps."""
        rule = rules_policy("{n_in: [1, x, ~, true, [1, 2], {k: v}]}").actions["a"].rules[0]
        assert rule.when[0].operand == [1, "x", None, True, [1, 2], {"k": "v"}]

    @pytest.mark.parametrize("op", ["eq", "neq"])
    @pytest.mark.parametrize("value", ["[[1]]", "[1, {a: 1}]"])
    def test_eq_list_must_be_flat(self, op: str, value: str) -> None:
        """eq/neq take a flat list only."""
        refused(V2 + f"actions:\n  a:\n    rules:\n      - when: {{n_{op}: {value}}}\n        decision: allow\n",
                "line 5", f"condition 'n_{op}'", "flat list")

    @pytest.mark.parametrize("value", ["1", "x", "~", "true", "[1, x, ~]", "{a: [1, {b: 2}]}", "[]"])
    def test_eq_operands_accepted(self, value: str) -> None:
        """eq takes a scalar, a mapping (any depth) or a flat list."""
        rules_policy(f"{{n_eq: {value}}}")

    def test_operand_is_plain_data(self) -> None:
        """Operands are plain lists and dicts, not loader types."""
        operand = rules_policy("{n_eq: {a: [1, 2]}}").actions["a"].rules[0].when[0].operand
        assert type(operand) is dict and type(operand["a"]) is list

    def test_condition_rejects_unknown_op(self) -> None:
        """A Condition built by hand must use a known operator."""
        with pytest.raises(InvalidArgument):
            Condition(key="n_like", argument="n", op="like", operand=1)


# --------------------------------------------------------------------------------------------
# §1.5 / §1.6 Evaluation
# --------------------------------------------------------------------------------------------


class TestDecisions:
    def test_unknown_action_is_denied(self) -> None:
        """No entry -> deny / unknown_action (there is no default allow)."""
        assert parse_policy(REFERENCE_DOC).evaluate("stripe.charge", {}) == Evaluation(Decision.DENY, "unknown_action")

    def test_bare_decision(self) -> None:
        """A bare decision -> that decision / decision."""
        policy = parse_policy(V2 + "actions:\n  a: {decision: approve}\n  b: {decision: allow}\n")
        assert policy.evaluate("a", {"anything": 1}) == Evaluation(Decision.APPROVE, "decision")
        assert policy.evaluate("b", {}) == Evaluation(Decision.ALLOW, "decision")

    def test_first_matching_rule_wins(self) -> None:
        """Rules are tried in document order; the reason is rule[N], 0-based."""
        policy = parse_policy(REFERENCE_DOC)
        assert policy.evaluate("stripe.refund", {"amount": 0}) == Evaluation(Decision.ALLOW, "rule[0]")
        assert policy.evaluate("stripe.refund", {"amount": 50000}) == Evaluation(Decision.ALLOW, "rule[0]")
        assert policy.evaluate("stripe.refund", {"amount": 50001}) == Evaluation(Decision.APPROVE, "rule[1]")
        assert policy.evaluate("stripe.refund", {"amount": 1000001}) == Evaluation(Decision.DENY, "rule[2]")

    def test_no_matching_rule(self) -> None:
        """No rule matches -> deny / no_matching_rule."""
        policy = rules_policy("{n_eq: 1}")
        assert policy.evaluate("a", {"n": 2}) == Evaluation(Decision.DENY, "no_matching_rule")

    def test_rule_without_when_always_matches(self) -> None:
        """A rule with no `when` matches every call."""
        policy = parse_policy(V2 + "actions:\n  a:\n    rules:\n      - decision: approve\n")
        assert policy.evaluate("a", {}) == Evaluation(Decision.APPROVE, "rule[0]")

    def test_conditions_are_anded(self) -> None:
        """All conditions of one `when` must hold."""
        when = "{n_gte: 1, n_lte: 10, c_eq: eur}"
        assert holds(when, n=5, c="eur")
        assert not holds(when, n=5, c="usd")
        assert not holds(when, n=11, c="eur")

    def test_reason_strings(self) -> None:
        """Evaluation carries a Decision and a plain reason string."""
        evaluation = parse_policy(REFERENCE_DOC).evaluate("stripe.refund", {"amount": 1})
        assert evaluation.decision == "allow" and str(evaluation.decision) == "allow"
        assert evaluation.reason == "rule[0]"

    def test_evaluate_is_pure(self) -> None:
        """Evaluating twice gives the same answer and leaves the arguments untouched."""
        policy = parse_policy(REFERENCE_DOC)
        arguments = {"amount": 100, "payment_id": "p1", "meta": {"k": [1, 2]}}
        snapshot = {"amount": 100, "payment_id": "p1", "meta": {"k": [1, 2]}}
        first = policy.evaluate("stripe.refund", arguments)
        assert policy.evaluate("stripe.refund", arguments) == first
        assert arguments == snapshot

    def test_rule_matches_directly(self) -> None:
        """Rule.matches is the AND of its conditions, usable on its own."""
        rule = Rule(
            index=0,
            when=(Condition("n_gt", "n", "gt", 1), Condition("c_eq", "c", "eq", "x")),
            decision=Decision.ALLOW,
        )
        assert rule.matches("a", {"n": 2, "c": "x"})
        assert not rule.matches("a", {"n": 1, "c": "x"})


class TestMissingArgument:
    @pytest.mark.parametrize("when", ["{n_eq: 1}", "{n_neq: 1}", "{n_in: [1]}", "{n_lt: 1}", "{n_lte: 1}", "{n_gt: 1}", "{n_gte: 1}"])
    def test_missing_argument_is_false(self, when: str) -> None:
        """A missing argument makes every operator false, neq included; never an error."""
        assert not holds(when, other=1)

    def test_missing_argument_logs_a_warning(self, caplog: pytest.LogCaptureFixture) -> None:
        """The warning on ctrlrun.policy names action, condition, argument and what the call has."""
        with caplog.at_level(logging.WARNING, logger="ctrlrun.policy"):
            assert not holds("{n_eq: 1}", b=1, a=2)
        records = [r for r in caplog.records if r.name == "ctrlrun.policy"]
        assert len(records) == 1 and records[0].levelno == logging.WARNING
        assert records[0].getMessage() == "a: condition n_eq ignored: the action has no argument 'n' (it has: a, b)"

    def test_missing_argument_no_arguments(self, caplog: pytest.LogCaptureFixture) -> None:
        """With no arguments at all, the warning says so."""
        with caplog.at_level(logging.WARNING, logger="ctrlrun.policy"):
            assert not holds("{n_neq: 1}")
        assert "has no argument 'n'" in caplog.text

    def test_none_is_not_missing(self) -> None:
        """An argument whose value is None is present: `n_eq: null` holds."""
        assert holds("{n_eq: ~}", n=None)
        assert not holds("{n_neq: ~}", n=None)


class TestEquality:
    @pytest.mark.parametrize(
        ("operand", "value", "expected"),
        [
            ("true", True, True),
            ("true", 1, False),
            ("1", True, False),
            ("0", False, False),
            ("false", 0, False),
            ("'1'", 1, False),
            ("1", "1", False),
            ("~", None, True),
            ("~", 0, False),
            ("~", "", False),
            ("Eur", "eur", False),
            ("eur", "eur", True),
            ("12345678901234567890123", 12345678901234567890123, True),
        ],
    )
    def test_scalars_are_type_strict(self, operand: str, value: object, expected: bool) -> None:
        """True != 1, 1 != True, "1" != 1, null == null, strings are case-sensitive."""
        assert holds(f"{{n_eq: {operand}}}", n=value) is expected

    def test_lists_by_length_and_order(self) -> None:
        """A list operand equals only a list of the same length and order."""
        assert holds("{n_eq: [1, 2]}", n=[1, 2])
        assert not holds("{n_eq: [1, 2]}", n=[2, 1])
        assert not holds("{n_eq: [1, 2]}", n=[1, 2, 3])
        assert not holds("{n_eq: [1, 2]}", n=[1])
        assert not holds("{n_eq: [1]}", n=[True])

    def test_tuple_counts_as_list(self) -> None:
        """A tuple argument compares like the list it canonicalises to."""
        assert holds("{n_eq: [1, 2]}", n=(1, 2))

    def test_maps_by_keys_and_values(self) -> None:
        """A mapping operand needs the same keys and equal values, recursively."""
        assert holds("{n_eq: {a: 1, b: [x]}}", n={"b": ["x"], "a": 1})
        assert not holds("{n_eq: {a: 1, b: [x]}}", n={"a": 1})
        assert not holds("{n_eq: {a: 1}}", n={"a": 1, "b": 2})
        assert not holds("{n_eq: {a: 1}}", n={"a": True})
        assert not holds("{n_eq: {a: 1}}", n={"c": 1})

    def test_container_never_equals_scalar(self) -> None:
        """A list or map never equals a scalar, and the reverse."""
        assert not holds("{n_eq: [1]}", n=1)
        assert not holds("{n_eq: 1}", n=[1])
        assert not holds("{n_eq: {a: 1}}", n="a")
        assert not holds("{n_eq: []}", n={})

    def test_float_argument_never_equals_int(self) -> None:
        """Raw float arguments (never canonical, but possible) do not equal ints."""
        assert not holds("{n_eq: 1}", n=1.0)

    def test_neq_is_not_eq(self) -> None:
        """neq is the negation of eq, with the same strictness."""
        assert holds("{n_neq: 1}", n=True)
        assert holds("{n_neq: 1}", n="1")
        assert holds("{n_neq: [1, 2]}", n=[2, 1])
        assert not holds("{n_neq: x}", n="x")

    def test_in_examples(self) -> None:
        """in = eq to any item: True not in [1,2]; [1,2] in [[1,2]]; [1,2] not in [1,2]."""
        assert not holds("{n_in: [1, 2]}", n=True)
        assert holds("{n_in: [[1, 2]]}", n=[1, 2])
        assert not holds("{n_in: [1, 2]}", n=[1, 2])
        assert holds("{n_in: [1, 2]}", n=2)
        assert holds("{n_in: [{k: v}]}", n={"k": "v"})
        assert not holds("{n_in: []}", n=1)


class TestNumeric:
    @pytest.mark.parametrize(
        ("op", "value", "expected"),
        [
            ("lt", 9, True), ("lt", 10, False),
            ("lte", 10, True), ("lte", 11, False),
            ("gt", 11, True), ("gt", 10, False),
            ("gte", 10, True), ("gte", 9, False),
        ],
    )
    def test_comparisons(self, op: str, value: int, expected: bool) -> None:
        """lt/lte/gt/gte compare the int argument with the operand."""
        assert holds(f"{{n_{op}: 10}}", n=value) is expected

    def test_negative_operands(self) -> None:
        """Negative ints work as operands."""
        assert holds("{n_gte: -5}", n=-5)
        assert not holds("{n_gte: -5}", n=-6)

    @pytest.mark.parametrize(("value", "kind"), [(True, "bool"), (False, "bool"), ("5", "str"), (None, "NoneType"), ([5], "list"), (5.0, "float")])
    def test_non_int_argument_is_false_with_warning(
        self, caplog: pytest.LogCaptureFixture, value: object, kind: str
    ) -> None:
        """A numeric op on a bool, str, None, list or float is false, with a warning naming the type."""
        with caplog.at_level(logging.WARNING, logger="ctrlrun.policy"):
            assert not holds("{n_gte: 0}", n=value)
        assert f"argument 'n' is {kind}, not int" in caplog.text
        assert "a: condition n_gte" in caplog.text

    def test_bool_fails_even_where_int_would_pass(self) -> None:
        """`n_lte: 1` with n=True is false (True would compare as 1 in Python)."""
        assert not holds("{n_lte: 1}", n=True)
        assert holds("{n_lte: 1}", n=1)

    def test_later_rule_still_applies_after_type_mismatch(self) -> None:
        """A false condition only skips its rule; the next rule is tried."""
        policy = parse_policy(doc("""\
            actions:
              a:
                rules:
                  - when: {n_lte: 10}
                    decision: allow
                  - when: {n_eq: true}
                    decision: approve
            """))
        assert policy.evaluate("a", {"n": True}) == Evaluation(Decision.APPROVE, "rule[1]")


# --------------------------------------------------------------------------------------------
# §1.7 Policy hash
# --------------------------------------------------------------------------------------------


class TestHash:
    def test_format(self) -> None:
        """The hash is sha256: + 64 lowercase hex."""
        assert re.fullmatch(r"sha256:[0-9a-f]{64}", parse_policy(REFERENCE_DOC).hash)

    def test_manual_recompute(self) -> None:
        """The hash is sha256 of the canonical bytes of the §1.7 envelope."""
        expected = sha256_hash(canonical_bytes({
            "actions": {
                "stripe.refund": {
                    "effect": "refund:{payment_id}",
                    "resource": "payment:{payment_id}",
                    "mcp": {"not_executed_on_error": False},
                    "rules": [
                        {"when": {"amount_gte": 0, "amount_lte": 50000}, "decision": "allow"},
                        {"when": {"amount_gte": 0, "amount_lte": 1000000}, "decision": "approve"},
                        {"decision": "deny"},
                    ],
                },
                "iam.grant_admin": {"decision": "deny"},
            },
            "authority": None,
            "controls": None,
            "environment": "production",
            "mode": "enforce",
            "schema": "ctrlrun.policy/v2",
        }))
        assert parse_policy(REFERENCE_DOC).hash == expected

    def test_key_order_and_formatting_ignored(self) -> None:
        """Swapping keys, flow vs block style and comments keep the hash."""
        swapped = doc("""\
            # the same policy, written differently
            actions:
              iam.grant_admin: {decision: deny}
              stripe.refund:
                rules:
                  - {decision: allow, when: {amount_lte: 50000, amount_gte: 0}}
                  - decision: approve
                    when:
                      amount_lte: 1000000
                      amount_gte: 0
                  - decision: "deny"
                mcp:
                  not_executed_on_error: no
                resource: 'payment:{payment_id}'
                effect: refund:{payment_id}
            """)
        assert parse_policy(swapped).hash == parse_policy(REFERENCE_DOC).hash

    def test_top_level_order_ignored(self) -> None:
        """`actions` before `schema` hashes the same."""
        a = parse_policy("schema: ctrlrun.policy/v2\nactions:\n  a: {decision: allow}\n")
        b = parse_policy("actions:\n  a: {decision: allow}\nschema: ctrlrun.policy/v2\n")
        assert a.hash == b.hash

    def test_rule_order_matters(self) -> None:
        """Swapping two rules changes the hash (and the behaviour)."""
        first = parse_policy(V2 + "actions:\n  a:\n    rules:\n      - {when: {n_eq: 1}, decision: allow}\n      - {decision: deny}\n")
        second = parse_policy(V2 + "actions:\n  a:\n    rules:\n      - {decision: deny}\n      - {when: {n_eq: 1}, decision: allow}\n")
        assert first.hash != second.hash

    def test_decision_change_changes_hash(self) -> None:
        """Any change to what the rules say changes the hash."""
        assert parse_policy(V2 + "actions: {a: {decision: allow}}\n").hash != parse_policy(
            V2 + "actions: {a: {decision: deny}}\n"
        ).hash

    def test_environment_is_hashed(self) -> None:
        """The same text in another environment has another hash."""
        assert parse_policy(REFERENCE_DOC).hash != parse_policy(REFERENCE_DOC, environment="staging").hash
        assert parse_policy(REFERENCE_DOC).hash == parse_policy(REFERENCE_DOC, environment="production").hash

    def test_schema_is_hashed(self) -> None:
        """v1 and v2 documents with the same actions hash differently."""
        body = "actions: {a: {decision: allow}}\n"
        assert parse_policy("schema: ctrlrun.policy/v1\n" + body).hash != parse_policy(V2 + body).hash

    def test_yaml_int_spellings_hash_alike(self) -> None:
        """Hashing is over values as parsed: a signed decimal +16 and 16 are the same int."""
        assert rules_policy("{n_eq: +16}").hash == rules_policy("{n_eq: 16}").hash

    def test_merge_expanded_in_hash(self) -> None:
        """Anchors and merges hash as the expanded mapping."""
        merged = parse_policy(V2 + "actions:\n  a: &b {decision: allow}\n  c: {<<: *b}\n")
        spelled = parse_policy(V2 + "actions:\n  a: {decision: allow}\n  c: {decision: allow}\n")
        assert merged.hash == spelled.hash

    def test_source_does_not_change_hash(self) -> None:
        """The source name is not part of the hash."""
        assert parse_policy(REFERENCE_DOC, "a.yaml").hash == parse_policy(REFERENCE_DOC, "b.yaml").hash

    def test_policy_is_hashable(self) -> None:
        """A Policy can be used as a dict key or cached."""
        policy = parse_policy(REFERENCE_DOC)
        assert {policy: 1}[policy] == 1
