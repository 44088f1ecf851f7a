"""ctrlrun.display: what a person reads is never rendered raw when it holds invisible,
direction-changing or control characters; each is shown as a visible escape, and the JSON
dumper escapes only those, so its output stays valid JSON that decodes to the very same value."""
from __future__ import annotations

import json

import pytest

from ctrlrun.display import (WARNING, dumps, dumps_html, has_hidden, hidden_fields, reveal, reveal_html, value_has_hidden,
                             warning)

#: Bidi and format controls (category Cf), C0/C1 controls (Cc), separators and look-alike spaces,
#: and default-ignorable letters/marks that render as nothing.
HIDDEN = [
    "\u200b", "\u200c", "\u200d", "\u200e", "\u200f",            # zero widths, LRM, RLM
    "\u202a", "\u202b", "\u202c", "\u202d", "\u202e",            # embeddings and overrides
    "\u2060", "\u2061", "\u2062", "\u2063", "\u2064",            # word joiner, invisible operators
    "\u2066", "\u2067", "\u2068", "\u2069",                      # isolates
    "\ufeff", "\u061c", "\u00ad", "\u180e", "\U000e0041",        # BOM, ALM, soft hyphen, MVS, a tag
    "\x00", "\x07", "\x1b", "\t", "\n", "\r", "\x7f",            # C0 and DEL
    "\x80", "\x85", "\x9b",                                      # C1
    "\u2028", "\u2029", "\u00a0", "\u2007", "\u3000",            # separators, look-alike spaces
    "\u034f", "\ufe0f", "\u3164", "\u115f",                      # CGJ, a variation selector, fillers
]
PLAIN = ["txn_1", "refund:txn_9", "café", "Grüße", "日本語", "עברית", "مرحبا", "a b", "😀", "{\"a\": 1}", "C:\\x"]


@pytest.mark.parametrize("char", HIDDEN, ids=lambda c: f"U+{ord(c):04X}")
def test_each_hidden_character_is_found_and_escaped(char):
    """Every bidi/format/control/invisible character is detected and replaced by its visible escape."""
    text = f"txn_1{char}0001"
    assert has_hidden(text)
    shown = reveal(text)
    assert char not in shown
    assert shown == "txn_1" + (f"\\u{ord(char):04x}" if ord(char) <= 0xFFFF else f"\\U{ord(char):08x}") + "0001"


@pytest.mark.parametrize("text", PLAIN)
def test_ordinary_text_is_left_alone(text):
    """Visible text in any script (right-to-left letters included) is shown as it is, with no warning."""
    assert not has_hidden(text)
    assert reveal(text) == text


def test_the_right_to_left_override_example():
    """The approval attack: 'txn_1' RLO '0001' is shown as txn_1\\u202e0001."""
    assert reveal("txn_1\u202e0001") == "txn_1\\u202e0001"


def test_multiline_keeps_line_breaks_only():
    """A note may span lines: with multiline a newline stays, every other hidden character is still escaped."""
    assert not has_hidden("line one\nline two", multiline=True)
    assert reveal("one\ntwo\u202e", multiline=True) == "one\ntwo\\u202e"
    assert reveal("one\r\ntwo", multiline=True) == "one\\u000d\ntwo"


def test_none_and_empty():
    """Nothing to show is nothing hidden."""
    assert not has_hidden(None) and not has_hidden("")
    assert reveal("") == ""


def test_nested_values_are_searched_keys_included():
    """A hidden character in a mapping key, a nested list or a value is found; numbers and booleans are not text."""
    assert value_has_hidden({"a": {"k\u202ey": 1}})
    assert value_has_hidden({"a": [1, "x\u200b"]})
    assert value_has_hidden("\u2066")
    assert not value_has_hidden({"amount": 500000, "ok": True, "none": None, "id": "txn_1", "list": ["a"]})


@pytest.mark.parametrize("value", [
    {"payment_id": "txn_1\u202e0001", "amount": 500000},
    {"k\u202ey": "v\u2066", "nested": [{"\u200b": "\U000e0041"}], "plain": "café", "c1": "\x85\x9b", "nul": "\x00"},
    {"backslash": "a\\u202e", "quote": "\"", "tab": "\t", "lf": "\n"},
    ["\u2028", "\u2029", "\ufeff"],
])
def test_dumps_is_valid_json_of_the_same_value_with_nothing_hidden_raw(value):
    """The dumper's output decodes to exactly the value given and contains no raw hidden character."""
    for options in ({}, {"indent": 2, "sort_keys": True}, {"separators": (",", ":")}):
        text = dumps(value, **options)
        assert json.loads(text) == value
        assert not has_hidden(text, multiline=True)
        if isinstance(value, dict) and "plain" in value:
            assert "café" in text  # visible non-ASCII text stays as it is


def test_dumps_escapes_only_hidden_characters():
    """Visible non-ASCII stays readable (no \\u escapes for it); the override becomes \\u202e."""
    assert dumps({"name": "Grüße\u202e"}) == '{"name": "Grüße\\u202e"}'


def test_reveal_html_escapes_markup_and_marks_each_escape():
    """HTML is escaped and each escape sits in a highlighted span naming the character."""
    shown = reveal_html("<b>txn_1\u202e0001</b>")
    assert shown == ('&lt;b&gt;txn_1<span class="ctrlrun-hidden" title="U+202E RIGHT-TO-LEFT OVERRIDE">'
                     '\\u202e</span>0001&lt;/b&gt;')
    assert reveal_html("plain & simple") == "plain &amp; simple"
    assert 'title="U+0007 (a control character)"' in reveal_html("\x07")


def test_dumps_html_marks_hidden_escapes_but_not_literal_backslashes():
    """In the JSON shown on a page, escapes of hidden characters are marked; an escaped backslash or quote is not."""
    shown = dumps_html({"a": "x\u202ey", "b": "lit\\u202e", "c": "q\"", "d": "t\tn\n", "e": "<i>"})
    assert shown.count('class="ctrlrun-hidden"') == 3  # \u202e, \t and \n
    assert '<span class="ctrlrun-hidden" title="U+202E RIGHT-TO-LEFT OVERRIDE">\\u202e</span>' in shown
    assert "lit\\\\u202e" in shown and "&lt;i&gt;" in shown and "\u202e" not in shown


def test_dumps_html_marks_astral_characters_as_one_escape():
    """A character outside the BMP is one marked surrogate-pair escape, still valid JSON once the marks are gone."""
    shown = dumps_html(["\U000e0041"])
    assert shown == ('[&quot;<span class="ctrlrun-hidden" title="U+E0041 TAG LATIN CAPITAL LETTER A">'
                     '\\udb40\\udc41</span>&quot;]')
    assert json.loads(dumps(["\U000e0041"])) == ["\U000e0041"]


def test_the_warning_says_what_is_shown_is_what_runs():
    """The warning names invisible and direction-changing characters and says the escaped text is exactly what will run."""
    assert "invisible or direction-changing characters" in WARNING
    assert "exactly what will run" in WARNING


def test_hidden_fields_name_each_part_of_the_action():
    """The warning names the parts of the action that hide characters, and only those."""
    action = {"name": "stripe.refund", "arguments": {"k\u202ey": 1, "id": "txn\u200b"}, "environment": "production",
              "principal": {"agent": "agent", "user": "dana\u2066"}, "resource": None}
    assert hidden_fields(action, "refund:txn\u200b") == ["argument names", "argument values", "user", "effect key"]
    assert hidden_fields({"name": "a", "arguments": {"x": "y"}, "principal": {"agent": "b"}}, "k") == []
    text = warning(["argument values", "effect key"])
    assert text.startswith("This action contains invisible or direction-changing characters (in its argument "
                           "values, effect key).") and text.endswith("exactly what will run.")
