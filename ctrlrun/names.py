"""Whether two names are the same person: the check behind "you cannot approve your own request".

A request is made on behalf of a user (``ctrlrun.context(agent=..., user="alice")``); that user
must not answer it. Comparing the strings exactly lets ``" alice"``, ``"Alice"``,
``"alice\\u200b"`` or ``"\\u0430lice"`` (a Cyrillic a) through to ``alice``. So names are compared
after ``normalize_identity``:

1. Unicode NFKC (fullwidth and other compatibility forms become plain letters);
2. Greek and Cyrillic capitals that look like Latin capitals become those Latin letters (before
   case folding, because the lowercase of Greek Nu is a v-like letter and of Cyrillic En an
   h-like one);
3. full case folding (``ß`` becomes ``ss``), and NFKC again (folding can denormalise);
4. lowercase Greek and Cyrillic look-alikes become the Latin letters they look like;
5. format characters (category Cf: zero-width characters, bidi controls, the BOM, the soft
   hyphen...), other invisible fillers and control characters other than whitespace removed;
6. surrounding whitespace stripped and inner runs of whitespace collapsed to one space.

The look-alike tables are small and explicit on purpose: they list the letters that pass for
Latin ones in common fonts, not all of Unicode's confusables (UTS #39). A false match only makes
the console refuse a self-approval that was in fact someone else's (another person then
answers), which is the safe side; a missed look-alike is what the tables are there to prevent.
Look-alikes within Latin itself (``l`` and ``I``, ``rn`` and ``m``) are not folded: they would
make distinct, ordinary usernames collide.

Pure and standard library only.
"""
from __future__ import annotations

import unicodedata

__all__ = ["normalize_identity", "same_person"]

#: Capitals, read before case folding: Greek and Cyrillic letters drawn like a Latin capital.
_CAPITALS = str.maketrans({
    # Greek
    "\u0391": "A", "\u0392": "B", "\u0395": "E", "\u0396": "Z", "\u0397": "H", "\u0399": "I", "\u039a": "K",
    "\u039c": "M", "\u039d": "N", "\u039f": "O", "\u03a1": "P", "\u03a4": "T", "\u03a5": "Y", "\u03a7": "X",
    # Cyrillic
    "\u0405": "S", "\u0406": "I", "\u0408": "J", "\u0410": "A", "\u0412": "B", "\u0415": "E", "\u041a": "K",
    "\u041c": "M", "\u041d": "H", "\u041e": "O", "\u0420": "P", "\u0421": "C", "\u0422": "T", "\u0423": "Y",
    "\u0425": "X", "\u04ae": "Y", "\u04c0": "I", "\u051a": "Q", "\u051c": "W",
})

#: Lowercase letters, read after case folding: Greek, Cyrillic and a few Latin variants drawn like
#: a basic Latin lowercase letter.
_SMALL = str.maketrans({
    # Greek
    "\u03b1": "a", "\u03b9": "i", "\u03ba": "k", "\u03bd": "v", "\u03bf": "o", "\u03c1": "p", "\u03c5": "u",
    # Cyrillic
    "\u0430": "a", "\u0435": "e", "\u043e": "o", "\u0440": "p", "\u0441": "c", "\u0443": "y", "\u0445": "x",
    "\u0455": "s", "\u0456": "i", "\u0458": "j", "\u04bb": "h", "\u04cf": "l", "\u0501": "d", "\u051b": "q",
    "\u051d": "w", "\u04af": "y",
    # Latin variants NFKC leaves alone
    "\u0131": "i", "\u0261": "g", "\u0251": "a",
})

#: Invisible letters and marks outside category Cf (Unicode's default-ignorable code points).
_IGNORABLE = frozenset(
    [0x034F, 0x115F, 0x1160, 0x17B4, 0x17B5, 0x180B, 0x180C, 0x180D, 0x180F, 0x3164, 0xFFA0]
    + list(range(0xFE00, 0xFE10)) + list(range(0xE0100, 0xE01F0))
)


def _visible(char: str) -> bool:
    category = unicodedata.category(char)
    if category == "Cf" or ord(char) in _IGNORABLE:
        return False
    return category != "Cc" or char.isspace()  # a tab or newline still separates words


def normalize_identity(name: str) -> str:
    """The form of a person's name that two spellings of one person share (see the module docstring)."""
    text = unicodedata.normalize("NFKC", name)
    text = text.translate(_CAPITALS)
    text = unicodedata.normalize("NFKC", text.casefold())
    text = text.translate(_SMALL)
    text = "".join(char for char in text if _visible(char))
    return " ".join(text.split())


def same_person(a: str | None, b: str | None) -> bool:
    """Whether names ``a`` and ``b`` are one person. A missing or (once normalised) empty name is nobody."""
    if not isinstance(a, str) or not isinstance(b, str):
        return False
    first, second = normalize_identity(a), normalize_identity(b)
    return bool(first) and first == second
