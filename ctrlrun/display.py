"""What a person reads before deciding: characters that render as nothing, or that change the
direction of the text around them, shown as visible escapes instead.

An argument ``"txn_1\\u202e0001"`` (U+202E RIGHT-TO-LEFT OVERRIDE) renders as ``txn_11000`` in
a browser or a terminal: the approver would authorise text different from what runs. Wherever
ctrlrun shows an action to a person (the console's approval, confirmation and effect pages and
lists, ``approvals``, ``inspect``), each such character is replaced by its escape (``\\u202e``;
``\\U000e0041`` beyond the BMP), highlighted in the console, and a warning says so.

Hidden here means (``is_hidden``):

- Unicode category ``Cc`` (C0 and C1 controls, DEL; tab and line breaks too, except where text
  may span lines), ``Cf`` (bidi embeddings, overrides and isolates, LRM/RLM/ALM, zero-width
  characters, the word joiner and invisible operators, the BOM, the soft hyphen, tags...),
  ``Zl`` and ``Zp`` (line and paragraph separators), ``Zs`` other than U+0020 (spaces that look
  like a space but are not one), ``Co`` (private use), ``Cs`` (lone surrogates) and ``Cn``
  (unassigned);
- the default-ignorable letters and marks that render as nothing (combining grapheme joiner,
  Hangul fillers, Khmer inherent vowels, Mongolian and other variation selectors) and the
  blank Braille pattern.

A backslash is left as it is: a name that holds the six characters ``\\u202e`` looks like an
escape in plain text. The console tells the two apart (a real escape is highlighted and
titled with the character's name), and the commands print their warning only when a real
hidden character is present.

Pure and standard library only: the console and the commands both use it.
"""
from __future__ import annotations

import html
import json
import re
import unicodedata
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["WARNING", "HIDDEN_CLASS", "is_hidden", "has_hidden", "value_has_hidden", "hidden_fields", "is_blank", "warning",
           "escape", "describe", "reveal", "reveal_html", "dumps", "dumps_html", "json_text"]

_WARNING_END = ("Each is shown escaped (like \\u202e) instead of being rendered, and what is shown escaped is "
                "exactly what will run.")
#: What the console and the commands say when an action holds hidden characters.
WARNING = f"This action contains invisible or direction-changing characters. {_WARNING_END}"

#: The CSS class of a highlighted escape in the console.
HIDDEN_CLASS = "ctrlrun-hidden"

_HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Co", "Cs", "Cn"})
#: Letters and marks of other categories that render as nothing (Unicode's default-ignorable code
#: points outside Cf), and the blank Braille pattern, which shows as a space.
_INVISIBLE_RANGES = (
    (0x034F, 0x034F),    # COMBINING GRAPHEME JOINER
    (0x115F, 0x1160),    # HANGUL CHOSEONG / JUNGSEONG FILLER
    (0x17B4, 0x17B5),    # KHMER VOWEL INHERENT AQ / AA
    (0x180B, 0x180F),    # MONGOLIAN FREE VARIATION SELECTORS (U+180E is Cf)
    (0x2800, 0x2800),    # BRAILLE PATTERN BLANK
    (0x3164, 0x3164),    # HANGUL FILLER
    (0xFE00, 0xFE0F),    # VARIATION SELECTORS
    (0xFFA0, 0xFFA0),    # HALFWIDTH HANGUL FILLER
    (0xE0100, 0xE01EF),  # VARIATION SELECTORS SUPPLEMENT
)


def is_hidden(char: str, *, multiline: bool = False) -> bool:
    """Whether this one character must be shown escaped (``multiline``: a newline may stay)."""
    if char == " " or (multiline and char == "\n"):
        return False
    category = unicodedata.category(char)
    if category in _HIDDEN_CATEGORIES or category == "Zs":  # every space but U+0020 (returned above)
        return True
    code = ord(char)
    return any(low <= code <= high for low, high in _INVISIBLE_RANGES)


def _hidden_chars(text: str, multiline: bool) -> Iterator[tuple[int, str]]:
    """(position, character) of each hidden character in ``text``."""
    if text.isascii():  # the common case: only C0 controls and DEL can hide
        for i, char in enumerate(text):
            if (char < " " or char == "\x7f") and not (multiline and char == "\n"):
                yield i, char
        return
    for i, char in enumerate(text):
        if is_hidden(char, multiline=multiline):
            yield i, char


def has_hidden(text: str | None, *, multiline: bool = False) -> bool:
    """Whether ``text`` holds any character that must be shown escaped."""
    return bool(text) and next(_hidden_chars(text, multiline), None) is not None


def value_has_hidden(value: Any) -> bool:
    """Whether a JSON-like value (strings, mapping keys included, lists, numbers...) holds a hidden character."""
    if isinstance(value, str):
        return has_hidden(value)
    if isinstance(value, dict):
        return any(value_has_hidden(k) or value_has_hidden(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return any(value_has_hidden(v) for v in value)
    return False


def hidden_fields(action: Mapping[str, Any], effect_key: str | None = None) -> list[str]:
    """Which parts of a canonical action (``name``, ``arguments``, ``principal``, ``resource``,
    ``environment``) and its effect key hold hidden characters, named for a warning."""
    arguments = action.get("arguments") or {}
    principal = action.get("principal") or {}
    parts = [
        ("action name", action.get("name")),
        ("argument names", list(arguments) if isinstance(arguments, dict) else []),
        ("argument values", list(arguments.values()) if isinstance(arguments, dict) else arguments),
        ("agent", principal.get("agent") if isinstance(principal, dict) else principal),
        ("user", principal.get("user") if isinstance(principal, dict) else None),
        ("resource", action.get("resource")),
        ("environment", action.get("environment")),
        ("effect key", effect_key),
    ]
    return [name for name, value in parts if value_has_hidden(value)]


def is_blank(text: str) -> bool:
    """Nothing a person could read: empty, or only spaces and invisible characters (a reason or a
    note made of these says nothing)."""
    return all(char.isspace() or is_hidden(char, multiline=True) for char in text)


def warning(fields: list[str], *, subject: str = "This action") -> str:
    """The warning for an action whose ``fields`` (from ``hidden_fields``) hold hidden characters."""
    where = f" (in its {', '.join(fields)})" if fields else ""
    return f"{subject} contains invisible or direction-changing characters{where}. {_WARNING_END}"


def escape(char: str) -> str:
    """The visible escape of one character: ``\\u202e``, or ``\\U000e0041`` beyond the BMP."""
    code = ord(char)
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def _json_escape(char: str) -> str:
    """The JSON escape of one character (a surrogate pair beyond the BMP), so the text stays valid JSON."""
    code = ord(char)
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def describe(char: str) -> str:
    """``U+202E RIGHT-TO-LEFT OVERRIDE``; a character without a name says what kind it is."""
    name = unicodedata.name(char, "")
    if name:
        return f"U+{ord(char):04X} {name}"
    kinds = {"Cc": "a control character", "Co": "a private-use character", "Cs": "a lone surrogate",
             "Cn": "an unassigned code point"}
    return f"U+{ord(char):04X} ({kinds.get(unicodedata.category(char), 'an invisible character')})"


def reveal(text: str, *, multiline: bool = False) -> str:
    """``text`` with every hidden character replaced by its visible escape (``txn_1\\u202e0001``)."""
    return _substitute(text, multiline, escape)


def _substitute(text: str, multiline: bool, replace: Any, plain: Any = str) -> str:
    """``text`` with each hidden character ``replace``d and every other run passed through ``plain``."""
    if not text:
        return plain(text or "")
    parts: list[str] = []
    last = 0
    for i, char in _hidden_chars(text, multiline):
        parts.append(plain(text[last:i]))
        parts.append(replace(char))
        last = i + 1
    parts.append(plain(text[last:]))
    return "".join(parts)


def _marked(shown: str, char: str) -> str:
    return f'<span class="{HIDDEN_CLASS}" title="{html.escape(describe(char))}">{html.escape(shown)}</span>'


def reveal_html(text: str, *, multiline: bool = False) -> str:
    """``text`` as HTML: escaped for markup, each hidden character a highlighted escape naming it.

    The result is safe to insert into an element's content (not into an attribute)."""
    return _substitute(text, multiline, lambda char: _marked(escape(char), char), html.escape)


def dumps(value: Any, *, indent: int | None = None, sort_keys: bool = False,
          separators: tuple[str, str] | None = None) -> str:
    """JSON as ``json.dumps(..., ensure_ascii=False)`` writes it, with hidden characters as JSON escapes.

    Visible non-ASCII text stays readable; the output is valid JSON that decodes to ``value``
    exactly (hidden characters can only occur inside strings, where an escape means the same)."""
    text = json.dumps(value, ensure_ascii=False, indent=indent, sort_keys=sort_keys, separators=separators)
    return _substitute(text, True, _json_escape)


def json_text(text: str) -> str:
    """JSON text (a stored document) with its hidden characters as JSON escapes: it decodes to the
    same value, and a terminal shows what is there. Text without them is returned unchanged."""
    return _substitute(text, True, _json_escape)


#: An escape sequence in JSON text, consumed whole (so an escaped backslash is never read as the
#: start of another escape). ``json.dumps(..., ensure_ascii=False)`` writes ``\\uXXXX`` only for
#: the C0 controls that have no short escape.
_JSON_ESCAPE = re.compile(r'\\(?:u[0-9a-fA-F]{4}|["\\/bfnrt])')
_SHORT_ESCAPES = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


def _json_html(text: str) -> str:
    """JSON text as HTML, each escape of (or raw) hidden character highlighted."""
    parts: list[str] = []
    last = 0
    for match in _JSON_ESCAPE.finditer(text):
        parts.append(_substitute(text[last:match.start()], True, lambda c: _marked(_json_escape(c), c), html.escape))
        token = match.group()
        body = token[1:]
        char = _SHORT_ESCAPES.get(body) or (chr(int(body[1:], 16)) if body.startswith("u") else None)
        parts.append(_marked(token, char) if char is not None and is_hidden(char) else html.escape(token))
        last = match.end()
    parts.append(_substitute(text[last:], True, lambda c: _marked(_json_escape(c), c), html.escape))
    return "".join(parts)


def dumps_html(value: Any, *, indent: int | None = None, sort_keys: bool = False,
               separators: tuple[str, str] | None = None) -> str:
    """``dumps(value)`` as HTML: markup escaped, each escape of a hidden character highlighted.

    Removing the highlight's tags and unescaping the HTML gives ``dumps(value)`` back."""
    text = json.dumps(value, ensure_ascii=False, indent=indent, sort_keys=sort_keys, separators=separators)
    return _json_html(text)
