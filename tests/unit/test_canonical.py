"""Unit tests for ctrlrun.canonical: canonical bytes, hashes, ids, actions, templates, tokens.

Pure layer: no database, no Django setup (spec §0, §2).
"""
from __future__ import annotations

import datetime as dt
import decimal
import math
import re

import pytest

from ctrlrun.canonical import (
    ACTION_SCHEMA,
    GENESIS_HASH,
    Action,
    Principal,
    Template,
    canonical_arguments,
    canonical_bytes,
    evidence_time,
    idempotency_token_for,
    new_id,
    sha256_hash,
)
from ctrlrun.errors import EffectKeyError, InvalidArgument

# §2.3 test vector
VECTOR_BYTES = (
    b'{"arguments":{"amount":500000,"payment_id":"txn_2"},"environment":"production",'
    b'"name":"stripe.refund","principal":{"agent":"support-agent","user":null},'
    b'"resource":null,"schema":"ctrlrun.action/v1"}'
)
VECTOR_HASH = "sha256:22ec1c398e4b93d080b6cba61e5e11b0e21879552ac5dbf63c192d2b2e6af752"
ID_PATTERN = re.compile(r"^act_[0-9a-f]{32}$")


def _vector_action(**overrides: object) -> Action:
    fields: dict[str, object] = {
        "name": "stripe.refund",
        "arguments": {"payment_id": "txn_2", "amount": 500000},
        "principal": Principal(agent="support-agent"),
    }
    fields.update(overrides)
    return Action(**fields)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# canonical_bytes: the byte form (§2.3)
# ---------------------------------------------------------------------------------------------


def test_canonical_bytes_sorts_keys_at_every_depth() -> None:
    """Keys come out sorted, in nested mappings too."""
    assert canonical_bytes({"b": 1, "a": {"d": 2, "c": 3}}) == b'{"a":{"c":3,"d":2},"b":1}'


def test_canonical_bytes_has_no_spaces() -> None:
    """Separators are ',' and ':' with no whitespace."""
    assert canonical_bytes({"a": [1, 2], "b": None}) == b'{"a":[1,2],"b":null}'


def test_canonical_bytes_keeps_non_ascii_as_raw_utf8() -> None:
    """Non-ASCII text is emitted as raw UTF-8, not \\u escapes."""
    out = canonical_bytes({"name": "Zoë 日本"})
    assert out == '{"name":"Zoë 日本"}'.encode("utf-8")
    assert b"\\u" not in out


def test_canonical_bytes_encodes_tuples_as_lists() -> None:
    """A tuple is canonicalised as a JSON array."""
    assert canonical_bytes({"t": (1, "a")}) == b'{"t":[1,"a"]}'


def test_canonical_bytes_accepts_all_allowed_scalars() -> None:
    """str, int, bool and None are allowed at any depth."""
    value = {"s": "x", "i": -7, "t": True, "f": False, "n": None, "l": [{"k": [1]}]}
    assert canonical_bytes(value) == b'{"f":false,"i":-7,"l":[{"k":[1]}],"n":null,"s":"x","t":true}'


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(1.5, id="float"),
        pytest.param(math.nan, id="nan"),
        pytest.param(b"x", id="bytes"),
        pytest.param(dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc), id="datetime"),
        pytest.param(decimal.Decimal("2000.00"), id="decimal"),
        pytest.param({1, 2}, id="set"),
        pytest.param(object(), id="object"),
        pytest.param({1: "a"}, id="non-str-key"),
        pytest.param("a\ud800b", id="lone-surrogate"),
    ],
)
def test_canonical_bytes_refuses_non_canonical_values(bad: object) -> None:
    """Floats, NaN, bytes, datetime, Decimal, set, objects, non-str keys, lone surrogates raise InvalidArgument."""
    with pytest.raises(InvalidArgument):
        canonical_bytes({"outer": {"inner": bad}})


@pytest.mark.parametrize(
    "bad, type_word",
    [
        pytest.param(1.5, "float", id="float"),
        pytest.param(math.nan, "float", id="nan"),
        pytest.param(b"x", "bytes", id="bytes"),
        pytest.param(dt.datetime(2026, 1, 1), "datetime", id="datetime"),
        pytest.param(decimal.Decimal("1"), "Decimal", id="decimal"),
        pytest.param({1}, "set", id="set"),
        pytest.param({1: "a"}, "int", id="non-str-key"),
        pytest.param("\udc80", "surrogate", id="lone-surrogate"),
    ],
)
def test_refused_argument_names_its_path(bad: object, type_word: str) -> None:
    """Building an Action with a bad argument raises InvalidArgument naming `arguments.<name>`."""
    with pytest.raises(InvalidArgument) as info:
        _vector_action(arguments={"amount": bad})
    message = str(info.value)
    assert "arguments.amount" in message
    assert type_word in message


def test_float_refusal_says_what_to_use_instead() -> None:
    """The float refusal suggests integer minor units or a decimal string (§2.2)."""
    with pytest.raises(InvalidArgument) as info:
        canonical_arguments({"amount": 2000.0})
    message = str(info.value)
    assert message.startswith("float is not an allowed argument type at arguments.amount")
    assert "integer minor units" in message and "decimal string" in message


def test_refused_argument_path_reaches_nested_items() -> None:
    """The path names nested keys and list indexes, e.g. arguments.a.b[1].c."""
    with pytest.raises(InvalidArgument, match=re.escape("arguments.a.b[1].c")):
        canonical_arguments({"a": {"b": [1, {"c": 1.0}]}})


def test_canonical_arguments_returns_a_fresh_plain_copy() -> None:
    """Arguments are copied (tuples become lists), so mutating the input leaves the copy intact."""
    source = {"items": ("a", "b"), "meta": {"k": ["v"]}}
    copy = canonical_arguments(source)
    assert copy == {"items": ["a", "b"], "meta": {"k": ["v"]}}
    source["meta"]["k"].append("w")  # type: ignore[index]
    assert copy["meta"]["k"] == ["v"]


def test_sha256_hash_format() -> None:
    """A hash is `sha256:` + 64 lowercase hex characters."""
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", sha256_hash(b"x"))


def test_genesis_hash_is_sixty_four_zeros() -> None:
    """The chain genesis is `sha256:` + 64 zeros (§0)."""
    assert GENESIS_HASH == "sha256:" + "0" * 64


# ---------------------------------------------------------------------------------------------
# Action: canonical form, hash, identity (§2.1, §2.3)
# ---------------------------------------------------------------------------------------------


def test_action_canonical_bytes_match_test_vector() -> None:
    """The §2.3 action canonicalises to exactly the reference bytes."""
    assert canonical_bytes(_vector_action().canonical()) == VECTOR_BYTES


def test_action_hash_matches_test_vector() -> None:
    """The §2.3 action hashes to exactly the reference hash."""
    assert _vector_action().hash == VECTOR_HASH


def test_action_schema_constant() -> None:
    """The action schema tag is ctrlrun.action/v1."""
    assert ACTION_SCHEMA == "ctrlrun.action/v1"


def test_action_hash_ignores_unhashed_principal_fields() -> None:
    """Claims, issuer and expiry are not part of the action hash."""
    principal = Principal("support-agent", claims={"role": "x"}, issuer="iss", expires_at="2030")
    assert _vector_action(principal=principal).hash == VECTOR_HASH


def test_action_hash_includes_user_resource_and_environment() -> None:
    """User, resource and environment each change the action hash."""
    hashes = {
        _vector_action(principal=Principal("support-agent", user="u1")).hash,
        _vector_action(resource="acct:1").hash,
        _vector_action(environment="staging").hash,
    }
    assert VECTOR_HASH not in hashes and len(hashes) == 3


def test_action_equality_is_by_action_id() -> None:
    """Two actions with identical content but different ids are different; same id means equal."""
    first, second = _vector_action(), _vector_action()
    assert first.hash == second.hash
    assert first != second
    same_id = _vector_action(arguments={"payment_id": "other"}, action_id=first.action_id)
    assert first == same_id
    assert len({first, second, same_id}) == 2


def test_action_id_is_act_plus_32_lowercase_hex() -> None:
    """A new action id is `act_` + 32 lowercase hex characters, fresh each time."""
    first, second = _vector_action(), _vector_action()
    assert ID_PATTERN.fullmatch(first.action_id)
    assert first.action_id != second.action_id


@pytest.mark.parametrize("prefix", ["act_", "ctr_", "apr_", "dlg_"])
def test_new_id_shape(prefix: str) -> None:
    """new_id gives the prefix plus 32 lowercase hex characters."""
    assert re.fullmatch(re.escape(prefix) + r"[0-9a-f]{32}", new_id(prefix))


def test_action_refuses_empty_name() -> None:
    """An action needs a non-empty name."""
    with pytest.raises(InvalidArgument):
        _vector_action(name="")


def test_action_refuses_non_mapping_arguments() -> None:
    """An action's arguments must be a mapping."""
    with pytest.raises(InvalidArgument):
        _vector_action(arguments=[("payment_id", "txn_2")])


@pytest.mark.parametrize("agent", ["", "   ", None])
def test_principal_refuses_blank_agent(agent: object) -> None:
    """A principal needs a non-empty agent name."""
    with pytest.raises(InvalidArgument):
        Principal(agent)  # type: ignore[arg-type]


def test_principal_refuses_empty_user() -> None:
    """user must be None or a non-empty string."""
    with pytest.raises(InvalidArgument):
        Principal("a", user="")


# ---------------------------------------------------------------------------------------------
# Idempotency token (§2.6)
# ---------------------------------------------------------------------------------------------


def test_idempotency_token_matches_test_vector() -> None:
    """("tok:t1", 1) gives the reference token 497c20d6-d847-8d19-8c14-fe31f5c9aeca."""
    assert idempotency_token_for("tok:t1", 1) == "497c20d6-d847-8d19-8c14-fe31f5c9aeca"


def test_idempotency_token_changes_with_attempt() -> None:
    """A renewed attempt on the same key gets a different token."""
    assert idempotency_token_for("tok:t1", 2) != idempotency_token_for("tok:t1", 1)


def test_idempotency_token_is_stable() -> None:
    """The same (key, attempt) always gives the same token."""
    assert idempotency_token_for("k", 3) == idempotency_token_for("k", 3)


def test_idempotency_token_changes_with_key() -> None:
    """Different effect keys give different tokens."""
    assert idempotency_token_for("tok:t2", 1) != idempotency_token_for("tok:t1", 1)


# ---------------------------------------------------------------------------------------------
# Template.parse (§2.4)
# ---------------------------------------------------------------------------------------------


def test_template_parse_splits_literals_and_names() -> None:
    """A valid template keeps its text and lists its placeholder names in order."""
    template = Template.parse("refund:{payment_id}/{resource}")
    assert template.text == "refund:{payment_id}/{resource}"
    assert template.names == ("payment_id", "resource")


def test_template_parse_literal_only() -> None:
    """A template with no placeholders is allowed and renders as itself."""
    assert Template.parse("fixed").render({}) == "fixed"


def test_template_parse_unclosed_placeholder_message() -> None:
    """'e:{x' is refused, naming the '{' at position 2."""
    with pytest.raises(InvalidArgument) as info:
        Template.parse("e:{x")
    assert str(info.value) == (
        "'e:{x' is not a valid template: expected literal text and '{name}' placeholders, "
        "found '{' at position 2"
    )


@pytest.mark.parametrize(
    "text, position",
    [
        pytest.param("a{{b}}", 1, id="double-brace"),
        pytest.param("{0}", 0, id="positional"),
        pytest.param("k:{a.b}", 2, id="attribute"),
        pytest.param("k:{a[0]}", 2, id="index"),
        pytest.param("k:{x:>3}", 2, id="format-spec"),
        pytest.param("k:{x!r}", 2, id="conversion"),
        pytest.param("k:{}", 2, id="empty-name"),
    ],
)
def test_template_parse_refuses_bad_open_brace(text: str, position: int) -> None:
    """`{{`, `{0}`, `{a.b}`, format specs and empty names are refused at their '{'."""
    with pytest.raises(InvalidArgument, match=re.escape(f"found '{{' at position {position}")):
        Template.parse(text)


@pytest.mark.parametrize(
    "text, position",
    [pytest.param("a}b", 1, id="lone"), pytest.param("k:{x}}", 5, id="after-placeholder")],
)
def test_template_parse_refuses_stray_close_brace(text: str, position: int) -> None:
    """A stray '}' is refused at its position."""
    with pytest.raises(InvalidArgument, match=re.escape(f"found '}}' at position {position}")):
        Template.parse(text)


@pytest.mark.parametrize("text", ["", None, 3])
def test_template_parse_refuses_empty_or_non_string(text: object) -> None:
    """An empty or non-string template is refused."""
    with pytest.raises(InvalidArgument, match="non-empty string"):
        Template.parse(text)


# ---------------------------------------------------------------------------------------------
# Template.render (§2.4, §2.5)
# ---------------------------------------------------------------------------------------------


def test_template_render_fills_strings() -> None:
    """A non-empty string value is inserted as is."""
    assert Template.parse("refund:{payment_id}").render({"payment_id": "txn_9"}) == "refund:txn_9"


def test_template_render_negative_int() -> None:
    """An int is rendered with str(): -3 gives e:-3."""
    assert Template.parse("e:{x}").render({"x": -3}) == "e:-3"


def test_template_render_zero_is_allowed() -> None:
    """The int 0 is a valid value (only the empty string is 'empty')."""
    assert Template.parse("e:{x}").render({"x": 0}) == "e:0"


@pytest.mark.parametrize(
    "value, word",
    [
        pytest.param(None, "is NoneType", id="none"),
        pytest.param("", "is empty", id="empty-str"),
        pytest.param(True, "is bool", id="bool"),
        pytest.param([], "is list", id="list"),
        pytest.param({}, "is dict", id="dict"),
    ],
)
def test_template_render_refuses_bad_values(value: object, word: str) -> None:
    """None, "", bool, list and dict raise EffectKeyError by default, saying why."""
    with pytest.raises(EffectKeyError) as info:
        Template.parse("e:{x}").render({"x": value})
    message = str(info.value)
    assert f"'{{x}}' {word}" in message
    assert "non-empty string or an int" in message


def test_template_render_missing_placeholder_names_have_list() -> None:
    """A missing placeholder names itself and the available argument names."""
    with pytest.raises(EffectKeyError) as info:
        Template.parse("e:{missing}").render({"x": 1})
    assert str(info.value) == "'e:{missing}': no value for '{missing}' (have: x)"


def test_template_render_missing_placeholder_with_no_arguments() -> None:
    """With no values at all the have-list says so."""
    with pytest.raises(EffectKeyError, match=r"\(have: no arguments\)"):
        Template.parse("e:{missing}").render({})


def test_template_render_error_class_parameter() -> None:
    """error= chooses the exception class (InvalidArgument for resource templates)."""
    template = Template.parse("res:{zz}")
    with pytest.raises(InvalidArgument) as info:
        template.render({"x": "1"}, error=InvalidArgument)
    assert not isinstance(info.value, EffectKeyError)
    assert str(info.value) == "'res:{zz}': no value for '{zz}' (have: x)"
    with pytest.raises(InvalidArgument):
        template.render({"zz": None}, error=InvalidArgument)


def test_template_render_refuses_overlong_key() -> None:
    """A rendered key over 1024 characters is refused."""
    with pytest.raises(EffectKeyError, match="1025 characters"):
        Template.parse("{x}").render({"x": "a" * 1025})


# ---------------------------------------------------------------------------------------------
# evidence_time (§0)
# ---------------------------------------------------------------------------------------------


def test_evidence_time_format() -> None:
    """UTC with milliseconds and a Z: 2026-11-29T17:21:57.420Z."""
    moment = dt.datetime(2026, 11, 29, 17, 21, 57, 420000, tzinfo=dt.timezone.utc)
    assert evidence_time(moment) == "2026-11-29T17:21:57.420Z"


def test_evidence_time_converts_other_zones_to_utc() -> None:
    """A time in another zone is converted to UTC first."""
    plus_two = dt.timezone(dt.timedelta(hours=2))
    moment = dt.datetime(2026, 11, 29, 19, 21, 57, 420000, tzinfo=plus_two)
    assert evidence_time(moment) == "2026-11-29T17:21:57.420Z"
    minus_five = dt.timezone(dt.timedelta(hours=-5))
    late = dt.datetime(2026, 12, 31, 22, 0, 0, 5000, tzinfo=minus_five)
    assert evidence_time(late) == "2027-01-01T03:00:00.005Z"


def test_evidence_time_truncates_to_milliseconds() -> None:
    """Sub-millisecond digits are dropped, never rounded into the next second."""
    moment = dt.datetime(2026, 11, 29, 17, 21, 57, 999999, tzinfo=dt.timezone.utc)
    assert evidence_time(moment) == "2026-11-29T17:21:57.999Z"


def test_evidence_time_none() -> None:
    """No moment gives None."""
    assert evidence_time(None) is None
