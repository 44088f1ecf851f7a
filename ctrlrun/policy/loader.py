"""Loading: a bounded, strict YAML safe load of hostile text.

Duplicate keys are refused, every mapping key and list item remembers its line, the size is
checked before parsing, and nesting and alias expansion are bounded while composing, so an alias
bomb is refused before anything walks it. No Django."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from ..errors import PolicyError


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


class YamlMap(dict):
    """A mapping as loaded, remembering its own line and the line of each key (1-based)."""

    line: int
    key_lines: dict[Any, int]


class _YamlList(list):
    """A sequence as loaded, remembering its own line and the line of each item (1-based)."""

    line: int
    item_lines: list[int]


@dataclass(frozen=True, eq=False)
class Refused:
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


REFUSED_HINTS = {
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


def describe_character(char: str) -> str:
    """``the control character U+0000 (NUL)``, ``the format character U+202E (RIGHT-TO-LEFT OVERRIDE)``."""
    code = ord(char)
    if 0xD800 <= code <= 0xDFFF:
        return f"the lone surrogate U+{code:04X} (half of a UTF-16 pair, not a character)"
    category = unicodedata.category(char)
    name = unicodedata.name(char, "") or (_C0_NAMES[code] if code < 0x20 else _C1_NAMES.get(code, ""))
    kinds = {"Cc": "control character", "Cf": "format character", "Cn": "noncharacter"}
    kind = kinds.get(category, "character")
    return f"the {kind} U+{code:04X}" + (f" ({name})" if name else "")


def quoted(text: str) -> str:
    """``repr`` of a string, shortened: enough to find it, with every hidden character escaped."""
    shown = repr(text)
    return shown if len(shown) <= 60 else shown[:56] + "...'"


def _check_text(text: str, source: str) -> None:
    """Refuse, before parsing, a text over MAX_POLICY_BYTES or holding a forbidden character."""
    if len(text) > MAX_POLICY_BYTES or (not text.isascii() and _utf8_size(text) > MAX_POLICY_BYTES):
        raise size_error(source, f"the policy is {_utf8_size(text):,} bytes")
    found = _FORBIDDEN_IN_TEXT.search(text)
    if found is None:
        return
    position = found.start()
    breaks = list(_LINE_BREAK.finditer(text, 0, position))
    line = len(breaks) + 1
    column = position - (breaks[-1].end() if breaks else 0) + 1
    character = describe_character(found.group())
    if "\ud800" <= found.group() <= "\udfff":
        advice = "the text was decoded wrongly; remove it or write the character it stands for"
    else:
        advice = f"only tab, newline and carriage return are ({_STORAGE_REASON}): remove it"
    raise policy_error(
        source, line, "", f"{character} at column {column} is not allowed in a policy; {advice}"
    )


def _utf8_size(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def size_error(source: str, size: str) -> PolicyError:
    return policy_error(
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


def _construct_map(loader: _Constructor, node: MappingNode) -> Iterator[YamlMap]:
    data = YamlMap()
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


def _construct_str(loader: _Constructor, node: Node) -> str | Refused:
    """A string, or a refusal when an escape put a control character or a lone surrogate in it."""
    value = loader.construct_scalar(node)
    found = _FORBIDDEN_IN_STRING.search(value)
    if found is None:
        return value
    character = describe_character(found.group())
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
    shown = quoted(value)
    return Refused("a string with a control character", shown, _line(node),
                    message=f"the string {shown} {problem}", key_message=f"the key {shown} {problem}")


#: The one integer spelling a policy reads as an int: decimal, with an optional sign.
_DECIMAL_INT = re.compile(r"[-+]?(?:0|[1-9][0-9]*)\Z")


def _construct_int(loader: _Constructor, node: Node) -> int | Refused:
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
    as_string = '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if value is None:
        message = (
            f"{text} is tagged or spelled as {kind}, which YAML cannot read as a number; write a plain "
            f"decimal integer, or quote it ({as_string}) to make it a string"
        )
    else:
        message = (
            f"{text} is {kind}, which YAML reads as {value}; a policy reads only plain decimal integers "
            f"as ints: write {value}, or quote it ({as_string}) to keep it as a string"
        )
    return Refused(kind, text, _line(node), message=message)


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
) -> Callable[[_Constructor, Node], Refused]:
    """A constructor that returns a :class:`Refused` marker instead of the value."""
    noun = "date" if what == "a timestamp" else what[2:]

    def construct(loader: _Constructor, node: Node) -> Refused:
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
        return Refused(kind, text, _line(node))

    return construct


def _refuse_collection(what: str) -> Callable[[_Constructor, Node], Refused]:
    def construct(loader: _Constructor, node: Node) -> Refused:
        return Refused(what, "", _line(node))

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


def policy_error(source: str, line: int | None, location: str, message: str) -> PolicyError:
    """Build the one message shape: ``<source>[, line N]: [<location>: ]<message>``."""
    prefix = source if line is None else f"{source}, line {line}"
    text = f"{prefix}: {location}: {message}" if location else f"{prefix}: {message}"
    error = PolicyError(text)
    error.source = source  # type: ignore[attr-defined]
    error.line = line  # type: ignore[attr-defined]
    error.location = location  # type: ignore[attr-defined]
    return error


def load_yaml(text: str, source: str) -> Any:
    """The loaded document; every failure, the reader's included, is a PolicyError."""
    _check_text(text, source)
    loader_class = _CLoader if _USE_LIBYAML and _CLoader is not None else _PyLoader
    loader = None
    try:
        loader = loader_class(text)
        return loader.get_single_data()
    except _Refusal as exc:
        raise policy_error(source, exc.line, "", exc.message) from None
    except yaml.YAMLError as exc:
        raise policy_error(source, None, "", f"not valid YAML: {_yaml_problem(exc)}") from None
    except (ValueError, OverflowError) as exc:  # a scalar constructor outside the wrapped ones
        raise policy_error(source, None, "", f"not valid YAML: {exc}") from None
    except RecursionError:
        raise policy_error(source, None, "", "not valid YAML: the document is nested too deeply") from None
    finally:
        if loader is not None:
            loader.dispose()


def type_name(value: Any) -> str:
    if isinstance(value, YamlMap):
        return "dict"
    if isinstance(value, _YamlList):
        return "list"
    if isinstance(value, Refused):
        return value.what
    return type(value).__name__


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
GRANT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\Z")


def join(path: str, key: Any) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    if _IDENTIFIER.match(key):
        return f"{path}.{key}" if path else key
    return f"{path}[{key!r}]"


def plain(value: Any) -> Any:
    """A plain-dict/list copy of the loaded tree (what the hash and the public fields hold)."""
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [plain(item) for item in value]
    return value


