"""ctrlrun.identity: the console decides whether the viewer is the person a request was made for
by comparing normalised names, so case, stray whitespace, invisible characters, compatibility
forms and common Cyrillic/Greek look-alikes cannot make one person look like two."""
from __future__ import annotations

import pytest

from ctrlrun.names import normalize_identity, same_person

SAME_AS_ALICE = [
    "alice",
    " alice",                 # leading space
    "alice\t",                # trailing tab
    "Alice",                  # case
    "ALICE",
    "alice\u200b",            # zero-width space (Cf)
    "\u202ealice",            # right-to-left override (Cf)
    "al\u00adice",            # soft hyphen (Cf)
    "\ufeffalice",            # byte-order mark (Cf)
    "\u0430lice",             # Cyrillic small a
    "\u0410lice",             # Cyrillic capital A
    "al\u0456ce",             # Cyrillic small byelorussian-ukrainian i
    "ali\u0441\u0435",        # Cyrillic small es and ie
    "\u0391lice",             # Greek capital alpha
    "\u03b1lice",             # Greek small alpha
    "\uff41\uff4c\uff49\uff43\uff45",  # fullwidth letters (NFKC)
    "alice\u00a0",            # no-break space at the end
]


@pytest.mark.parametrize("name", SAME_AS_ALICE, ids=ascii)
def test_variants_of_alice_are_alice(name):
    """Each spelling of alice that a person would read as alice normalises to 'alice'."""
    assert normalize_identity(name) == "alice"
    assert same_person(name, "alice") and same_person("alice", name)


@pytest.mark.parametrize("other", ["alicia", "bob", "al ice", "alice2", "malice", "ali"], ids=ascii)
def test_different_people_stay_different(other):
    """Names that differ in visible letters are different people."""
    assert not same_person("alice", other)


def test_internal_whitespace_is_collapsed_not_removed():
    """Runs of whitespace inside a name become one space; a space is still a difference."""
    assert normalize_identity("  dana \t\n smith  ") == "dana smith"
    assert same_person("dana  smith", "Dana Smith")
    assert not same_person("dana smith", "danasmith")


def test_greek_and_cyrillic_capitals_map_to_latin():
    """Uppercase look-alikes whose lowercase no longer looks Latin (Greek Nu, Eta; Cyrillic En) still match."""
    assert same_person("\u039d\u0399\u039a\u039f", "niko")         # Greek NIKO
    assert same_person("\u041d\u0410\u041d\u0421", "hahc")         # Cyrillic HAHC
    assert same_person("\u0397\u0395", "he")                        # Greek Eta, Epsilon


def test_case_folding_is_full():
    """Case folding, not lower(): German sharp s matches ss."""
    assert same_person("straße", "STRASSE")


def test_normalising_twice_changes_nothing():
    """normalize_identity is idempotent."""
    for name in SAME_AS_ALICE + ["Dana  Smith", "\u039d\u0399\u039a\u039f", "straße"]:
        once = normalize_identity(name)
        assert normalize_identity(once) == once


@pytest.mark.parametrize("a, b", [(None, "alice"), ("alice", None), (None, None), ("", ""), ("\u200b", ""),
                                  ("   ", " "), ("\u202e", "\u200b")], ids=ascii)
def test_nobody_is_nobodys_self(a, b):
    """A missing or empty (once normalised) name is nobody: it never matches, not even another empty one."""
    assert not same_person(a, b)


def test_result_is_text():
    """normalize_identity returns a str even for an empty name."""
    assert normalize_identity("") == "" and isinstance(normalize_identity("X"), str)


def test_the_old_import_path_still_works():
    """Name normalisation moved to ctrlrun.names; ctrlrun.identity (now the identity providers) re-exports it."""
    import ctrlrun.identity
    import ctrlrun.names

    assert ctrlrun.identity.same_person is ctrlrun.names.same_person
    assert ctrlrun.identity.normalize_identity is ctrlrun.names.normalize_identity
