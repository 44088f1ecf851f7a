"""Unit tests for ctrlrun.canonical: canonical bytes, hashes, ids, actions, templates, tokens.

Pure layer: no database, no Django setup (spec §0, §2).
"""
from __future__ import annotations

import datetime as dt
import decimal
import enum
import json
import math
import re
import sys
from collections.abc import Callable

import pytest

from ctrlrun.canonical import (
    ACTION_SCHEMA,
    GENESIS_HASH,
    MAX_ARGUMENTS_SIZE,
    MAX_DEPTH,
    MAX_INT_DIGITS,
    Action,
    Principal,
    Template,
    canonical_arguments,
    canonical_bytes,
    evidence_time,
    idempotency_token_for,
    new_id,
    sha256_hash,
    trusted_canonical_bytes,
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
    principal = Principal("support-agent", claims={"role": "x"}, issuer="iss",
                          expires_at=dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc))
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


# ---------------------------------------------------------------------------------------------
# str and int subclasses become exact builtins (one canonical value for the hash and the key)
# ---------------------------------------------------------------------------------------------


class Shouty(str):
    """A str subclass that lies about itself everywhere it can."""

    def __str__(self) -> str:
        return "LIES"

    def __format__(self, spec: str) -> str:
        return "LIES"

    def encode(self, *args: object, **kwargs: object) -> bytes:  # type: ignore[override]
        return b"LIES"


class Sneaky(int):
    """An int subclass whose every text and number conversion is overridden."""

    def __str__(self) -> str:
        return "LIES"

    def __repr__(self) -> str:
        return "LIES"

    def __format__(self, spec: str) -> str:
        return "LIES"

    def __int__(self) -> int:
        return -1

    def __index__(self) -> int:
        return -1


class Color(str, enum.Enum):
    RED = "red"


class Level(enum.StrEnum):
    HIGH = "high"


class Code(int, enum.Enum):
    TEAPOT = 418


class Tier(enum.IntEnum):
    GOLD = 3


class Perm(enum.IntFlag):
    READ = 1
    WRITE = 2


class Tagged(str):
    """A str subclass that is a different dict key from its own text (its own __eq__ and __hash__)."""

    def __eq__(self, other: object) -> bool:
        return type(other) is Tagged and str.__eq__(self, other)

    def __hash__(self) -> int:
        return hash(("tagged", str.__str__(self)))


class Impostor:
    """Claims to be a str through ``__class__`` (so ``isinstance(x, str)`` is True) but is not one."""

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        return str


SUBCLASS_VALUES = [
    pytest.param(Shouty("abc"), "abc", id="str-overridden-str"),
    pytest.param(Color.RED, "red", id="str-enum"),
    pytest.param(Level.HIGH, "high", id="StrEnum"),
    pytest.param(Tier.GOLD, 3, id="IntEnum"),
    pytest.param(Code.TEAPOT, 418, id="int-enum"),
    pytest.param(Perm.READ | Perm.WRITE, 3, id="IntFlag"),
    pytest.param(Sneaky(7), 7, id="int-overridden-str"),
]


def _exact(value: object) -> object:
    """``value`` with every str/int replaced by (type name, value), to compare types exactly."""
    if isinstance(value, dict):
        return {(type(k).__name__, k): _exact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_exact(v) for v in value]
    return (type(value).__name__, value)


@pytest.mark.parametrize("value, plain", SUBCLASS_VALUES)
def test_subclass_values_become_exact_builtins_at_every_depth(value: object, plain: object) -> None:
    """A str/int subclass becomes an exact str/int, alone, in a list and in a mapping."""
    copy = canonical_arguments({"k": value, "l": [1, value], "d": {"x": [value]}})
    assert _exact(copy) == _exact({"k": plain, "l": [1, plain], "d": {"x": [plain]}})


@pytest.mark.parametrize("value, plain", [p for p in SUBCLASS_VALUES if isinstance(p.values[0], str)])
def test_subclass_mapping_keys_become_exact_str(value: str, plain: str) -> None:
    """A str-subclass mapping key becomes an exact str, in nested mappings and at the top level."""
    copy = canonical_arguments({value: 1, "meta": {"d": {value: [{value: 2}]}}})
    assert _exact(copy) == _exact({plain: 1, "meta": {"d": {plain: [{plain: 2}]}}})


@pytest.mark.parametrize("value, plain", SUBCLASS_VALUES)
def test_subclass_and_its_value_are_one_action_and_one_effect_key(value: object, plain: object) -> None:
    """A subclass value and its plain value give the same canonical bytes, action hash and rendered key."""
    assert canonical_bytes({"k": [value]}) == canonical_bytes({"k": [plain]})
    assert _vector_action(arguments={"key": value}).hash == _vector_action(arguments={"key": plain}).hash
    template = Template.parse("pay:{key}")
    rendered = template.render({"key": value})
    assert type(rendered) is str and rendered == template.render({"key": plain}) == f"pay:{plain}"
    canonical = _vector_action(arguments={"key": value}).arguments
    assert template.render(canonical) == f"pay:{plain}"


def test_str_enum_member_and_its_value_are_the_same_call() -> None:
    """Color.RED and "red": same canonical bytes, same action hash, same effect key (pay:red)."""
    assert canonical_bytes({"key": Color.RED}) == canonical_bytes({"key": "red"}) == b'{"key":"red"}'
    enum_action = _vector_action(arguments={"key": Color.RED})
    plain_action = _vector_action(arguments={"key": "red"})
    assert enum_action.hash == plain_action.hash
    template = Template.parse("pay:{key}")
    assert template.render(enum_action.arguments) == template.render(plain_action.arguments) == "pay:red"
    assert template.render({"key": Color.RED}) == "pay:red"


@pytest.mark.parametrize("where", ["top", "nested"])
def test_keys_that_collide_once_converted_are_refused(where: str) -> None:
    """{Tagged("red"): .., "red": ..} holds two keys that both become "red": refused, naming the mapping."""
    colliding = {Tagged("red"): 1, "red": 2}
    assert len(colliding) == 2  # Tagged hashes apart from str, so the dict keeps both
    arguments = colliding if where == "top" else {"meta": {"inner": colliding}}
    with pytest.raises(InvalidArgument) as info:
        canonical_arguments(arguments)
    message = str(info.value)
    assert ("at arguments:" if where == "top" else "at arguments.meta.inner:") in message
    assert "both become 'red'" in message and "Tagged" in message


def test_class_impostor_is_refused_not_trusted() -> None:
    """An object whose __class__ claims str is refused as its real type, in values, keys and templates."""
    assert isinstance(Impostor(), str)
    with pytest.raises(InvalidArgument, match=r"Impostor is not an allowed argument type at arguments\.k"):
        canonical_arguments({"k": Impostor()})
    with pytest.raises(InvalidArgument, match=r"arguments\.d has a Impostor key"):
        canonical_arguments({"d": {Impostor(): 1}})
    with pytest.raises(EffectKeyError, match="is Impostor"):
        Template.parse("e:{x}").render({"x": Impostor()})


def test_render_uses_the_integer_value_of_an_int_subclass() -> None:
    """An int subclass with overridden __str__/__repr__/__format__/__int__ renders its integer value."""
    assert Template.parse("e:{x}/{y}").render({"x": Sneaky(-12), "y": Perm.READ | Perm.WRITE}) == "e:-12/3"


def test_principal_and_action_names_become_exact_str() -> None:
    """A str-subclass agent, user or action name is stored as an exact str."""
    principal = Principal(Shouty("support-agent"), user=Color.RED)
    assert (type(principal.agent), principal.agent) == (str, "support-agent")
    assert (type(principal.user), principal.user) == (str, "red")
    action = _vector_action(name=Shouty("stripe.refund"), principal=Principal(Shouty("support-agent")))
    assert type(action.name) is str and action.hash == VECTOR_HASH


# ---------------------------------------------------------------------------------------------
# Hostile arguments: every one is InvalidArgument naming what and where, never a raw error
# ---------------------------------------------------------------------------------------------


def _nested_lists(levels: int, leaf: object = 1) -> object:
    value = leaf
    for _ in range(levels):
        value = [value]
    return value


def _nested_dicts(levels: int, leaf: object = 1) -> object:
    value = leaf
    for _ in range(levels):
        value = {"d": value}
    return value


def _refusal(arguments: dict[str, object]) -> str:
    """The InvalidArgument message canonical_arguments gives; it must itself be valid UTF-8 text."""
    with pytest.raises(InvalidArgument) as info:
        canonical_arguments(arguments)
    message = str(info.value)
    message.encode("utf-8")
    return message


@pytest.mark.parametrize("key", ["a\ud800", "\udcff"])
def test_lone_surrogate_in_a_key_is_refused_with_its_path(key: str) -> None:
    """A mapping key with a lone surrogate is InvalidArgument naming the mapping; canonical_bytes too."""
    message = _refusal({"meta": {"ok": [{key: 1}]}})
    assert "arguments.meta.ok[0]" in message and "lone surrogate" in message
    with pytest.raises(InvalidArgument, match="lone surrogate"):
        canonical_bytes({key: 1})


def test_lone_surrogate_in_an_argument_name_is_refused() -> None:
    """An argument name (a top-level key) with a lone surrogate is refused at `arguments`."""
    assert "at arguments:" in _refusal({"bad\ud800": 1})


@pytest.mark.parametrize("build", [_nested_lists, _nested_dicts], ids=["lists", "dicts"])
def test_five_thousand_levels_deep_is_refused_not_a_recursion_error(build: Callable[[int], object]) -> None:
    """5,000 nested lists or mappings are InvalidArgument ("deeper than 64"), never RecursionError."""
    message = _refusal({"deep": build(5000)})
    assert message.startswith("arguments.deep") and f"deeper than {MAX_DEPTH}" in message
    with pytest.raises(InvalidArgument, match="deeper than"):
        canonical_bytes({"deep": build(5000)})


@pytest.mark.parametrize("build", [_nested_lists, _nested_dicts], ids=["lists", "dicts"])
def test_depth_limit_is_exactly_sixty_four_containers_per_argument(build: Callable[[int], object]) -> None:
    """64 nested containers in one argument are accepted (and the action hashes); 65 are refused."""
    assert MAX_DEPTH == 64
    action = _vector_action(arguments={"deep": build(MAX_DEPTH)})
    assert canonical_bytes(action.canonical()).count(b"[" if build is _nested_lists else b'{"d"') == MAX_DEPTH
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", action.hash)
    assert "deeper than 64" in _refusal({"deep": build(MAX_DEPTH + 1)})


def test_self_referencing_dict_is_refused_as_a_cycle() -> None:
    """A dict that contains itself: "refers to itself", naming both places."""
    looped: dict[str, object] = {"a": 1}
    looped["self"] = looped
    message = _refusal({"meta": looped})
    assert "arguments.meta.self refers to itself" in message
    assert "arguments.meta" in message.split("refers to itself", 1)[1]


def test_self_referencing_list_is_refused_as_a_cycle() -> None:
    """A list that contains itself (two levels down): "refers to itself" with the path."""
    looped: list[object] = [1]
    looped.append({"back": looped})
    message = _refusal({"items": looped})
    assert "arguments.items[1].back refers to itself" in message


def test_arguments_mapping_that_contains_itself_is_refused() -> None:
    """The arguments mapping itself as one of its values is a cycle at `arguments`."""
    arguments: dict[str, object] = {"a": 1}
    arguments["me"] = arguments
    assert "arguments.me refers to itself (it is the same object as arguments)" in _refusal(arguments)
    with pytest.raises(InvalidArgument, match="refers to itself"):
        canonical_bytes(arguments)


def test_the_same_list_twice_is_not_a_cycle() -> None:
    """A value shared by two places (no back-reference) is fine and is written twice."""
    shared = [1, 2]
    assert canonical_bytes({"a": shared, "b": {"c": shared}}) == b'{"a":[1,2],"b":{"c":[1,2]}}'


@pytest.mark.parametrize("sign", [1, -1], ids=["positive", "negative"])
def test_int_too_large_to_write_is_refused_not_a_value_error(sign: int) -> None:
    """An int of 5,000 digits (Python's str() refuses more than 4,300) is InvalidArgument with the path."""
    message = _refusal({"meta": {"n": [sign * 10**4999]}})
    assert "arguments.meta.n[0]" in message and f"more than {MAX_INT_DIGITS} digits" in message
    with pytest.raises(InvalidArgument, match="digits"):
        canonical_bytes({"n": sign * 10**4999})


def test_int_digit_limit_is_exact_and_independent_of_the_process_setting() -> None:
    """640 digits pass (written and read back even at the lowest int_max_str_digits); 641 fail."""
    biggest = 10**MAX_INT_DIGITS - 1
    assert len(str(biggest)) == MAX_INT_DIGITS == 640
    saved = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(640)  # the lowest limit a process can set
    try:
        written = canonical_bytes({"n": [biggest, -biggest]})
        assert written == f'{{"n":[{biggest},-{biggest}]}}'.encode()
        assert json.loads(written) == {"n": [biggest, -biggest]}  # and read back
        assert "more than 640 digits" in _refusal({"n": biggest + 1})
        assert "more than 640 digits" in _refusal({"n": -biggest - 1})
        assert "more than 640 digits" in _refusal({"n": Sneaky(biggest + 1)})
    finally:
        sys.set_int_max_str_digits(saved)


def test_huge_int_as_a_mapping_key_is_described_safely() -> None:
    """A non-str key whose repr() would raise (a 5,000-digit int) is still a clean InvalidArgument."""
    message = _refusal({"m": {10**4999: 1}})
    assert "arguments.m has a int key" in message


def test_total_size_limit_refuses_one_huge_string() -> None:
    """A string of more than 1 MiB is refused naming the limit."""
    assert MAX_ARGUMENTS_SIZE == 1024 * 1024
    message = _refusal({"blob": "x" * (MAX_ARGUMENTS_SIZE + 1)})
    assert message.startswith("arguments are larger than") and "1 MiB" in message


@pytest.mark.parametrize(
    "arguments",
    [
        pytest.param({"blob": "x" * (MAX_ARGUMENTS_SIZE - len(b'{"blob":""}'))}, id="one-string"),
        pytest.param({"many": [0] * ((MAX_ARGUMENTS_SIZE - 10) // 2)}, id="many-ints"),
        pytest.param({"keys": {f"{i:06d}": 0 for i in range((MAX_ARGUMENTS_SIZE - 10) // 11)}}, id="many-keys"),
    ],
)
def test_arguments_whose_json_fits_in_one_mib_are_accepted(arguments: dict[str, object]) -> None:
    """The size measure never exceeds the canonical JSON size: JSON of at most 1 MiB always passes."""
    size = len(trusted_canonical_bytes(arguments))
    assert MAX_ARGUMENTS_SIZE - 16 <= size <= MAX_ARGUMENTS_SIZE
    assert canonical_arguments(arguments) == arguments


@pytest.mark.parametrize(
    "arguments",
    [
        pytest.param({"many": [0] * (MAX_ARGUMENTS_SIZE // 2)}, id="many-ints"),
        pytest.param({"many": [None] * MAX_ARGUMENTS_SIZE}, id="many-nones"),
        pytest.param({"many": [{"k": i} for i in range(MAX_ARGUMENTS_SIZE // 7)]}, id="many-mappings"),
        pytest.param({"text": "日" * 400_000}, id="non-ascii-bytes"),
        pytest.param({"keys": {f"{i:07d}": None for i in range(200_000)}}, id="many-keys"),
        pytest.param({"big": [10**600] * 2000}, id="large-ints"),
    ],
)
def test_total_size_limit_counts_values_keys_bytes_and_digits(arguments: dict[str, object]) -> None:
    """Many small values, many keys, multi-byte text and large ints count towards the 1 MiB too."""
    assert len(trusted_canonical_bytes(arguments)) > MAX_ARGUMENTS_SIZE
    assert "larger than" in _refusal(arguments)


def test_hostile_resource_or_environment_is_refused_when_the_action_is_built() -> None:
    """A lone surrogate in an action's resource or environment is InvalidArgument at construction."""
    with pytest.raises(InvalidArgument, match="resource.*lone surrogate"):
        _vector_action(resource="acct:\ud800")
    with pytest.raises(InvalidArgument, match="environment.*lone surrogate"):
        _vector_action(environment="prod\udcff")


@pytest.mark.parametrize(
    "value, word",
    [
        pytest.param("a\ud800", "lone surrogate", id="lone-surrogate"),
        pytest.param(Shouty("\udcff"), "lone surrogate", id="surrogate-in-subclass"),
        pytest.param("a\x00b", "NUL", id="nul"),
        pytest.param(10**4999, "digits", id="huge-int"),
    ],
)
def test_template_render_refuses_unstorable_text_from_raw_values(value: object, word: str) -> None:
    """Rendering raw values with a lone surrogate, a NUL or a 5,000-digit int raises the chosen error."""
    with pytest.raises(InvalidArgument, match=word) as info:
        Template.parse("res:{x}").render({"x": value}, error=InvalidArgument)
    str(info.value).encode("utf-8")
    with pytest.raises(EffectKeyError, match=word):
        Template.parse("e:{x}").render({"x": value})
