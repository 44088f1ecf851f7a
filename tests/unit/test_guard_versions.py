"""The guard's frozen versions (ctrlrun/guards/): a migration installs its own version, never today's.

The newest frozen version is exactly what ``ctrlrun/guard.py`` builds today, so a change to the guard
fails here until it is a new version (a frozen file, a migration that installs it, ``guards.CURRENT``
moved on). Every version's text is pinned by its digest: a frozen version is never edited.
"""
from __future__ import annotations

import hashlib
import re

import pytest

from ctrlrun import guard, guards
from tests.support import REPO

#: sha256 of each version's statements, one a line, per vendor: what each migration installs, for good.
DIGESTS = {
    1: ("f5824538397ddf86de01c9246450bb2f31325e152022c3c23e16706e99b98eda",
        "82eaee0b0ca185bae577a22e440cc994a64393bcbdc70925ceac40541ba25297"),
    2: ("e528b9bebead5d51f0827111ce356595a419903a057d284d93ec47621c3bbf20",
        "7db999d7c7a232ec4137a84b5959be3b6c7290d58d61f965d120b302573e4fe3"),
    3: ("7d7f76508ea5d31e60670f9b405b1cd5f7f96bd1670cbcda71d2cdf9c8792491",
        "6d05c617520a794ad5fc80248fd08c7fb97f1d81723604f096460612beb20249"),
    4: ("7ac887f05c7ce8178255e3db770b16d71cedf6f5db9cc773292e9fb600bd9d67",
        "f4b260947fb38a276c826dbe6c0463490e0f8ec35bb921f84ed21cd5cd2629fa"),
    5: ("dc0bd08953704d59843d1eb09f8b009a01dd73b2e032c553174eb178731482bf",
        "456c3bc62ee537b88b1d9b81b9a90c97c63156cbe2fd5eddb1c360b8571c089a"),
    6: ("de67874ed56a70a342650e9b37c691fb284a6c045a194b3017bdd496882b8dae",
        "7622998ce60a51a8272d4ab07a67098f833088bc0c63a45fe227c553586791e8"),
    7: ("3d0aa24c949e20e73fa4fbb9e7261c2a74d39acd21bca7d15226fa1dc4b25ff3",
        "b923697487b9e224f910c0ec6aecad1728e3dffc769387fd6740d5c1571f4393"),
    8: ("f3db66ba39306dc453eb5b145e0f6d74084bf62f28afb4f3948c12e51edaa1d2",
        "331ecf57498bd2ea857278d29771af62a9bb807ed7ddc3339ad8deb43814b9cd"),
    9: ("f1e1c091dc44adc797fc965ad45fb86ee4a651d99567c5164fc95291d5015442",
        "4e50f99c161dd946b63f8c55b30ab2cb5426484f61b7f42216014d2974fdd190"),
    10: ("6e1362d400e4347f76a3f9b29cb8e41d79cb40a88eb940810754e42d0cbcb03b",
         "00123b0876b2a61d5747798cea2fb311596e92368628642efdbe44b31b13baca"),
    11: ("8e6df782714070eaedb58f3eb0861e1491b4755c81e13549293bb69d474ce427",
         "5d73a857de286d1290541eb46a87b5d14c61e776347eab1fbe9bf4dd719e1187"),
    12: ("bf981a001e636cf093998e4b37982e29123178f00449a61fe1ca6c69c3b447b9",
         "5d8457594300a6b6b835c3d7bfcefa2116fe22a2342067228be21c80ede30c42"),
    13: ("c83cf1a3104120edad3034253c38c368d65f0974543991aa29eb667fb575a39d",
         "ade01d3c27c831225a8781c24efd4c58fe8b20920a55ff9d7f866925dc212b7f"),
    14: ("c83cf1a3104120edad3034253c38c368d65f0974543991aa29eb667fb575a39d",
         "d48cef038bd32052c5cc028f7f78922f4e2de76fba4c655c6c4732fc3e3d55c8"),
}


def _digest(version: int, vendor: str) -> str:
    return hashlib.sha256("\n".join(guards.statements(version, vendor)).encode()).hexdigest()


def test_the_newest_version_is_what_guard_py_builds_today():
    assert guards.CURRENT == max(guards.VERSIONS)
    assert guards.statements(guards.CURRENT, "sqlite") == [s for _, s in guard._sqlite_statements()], (
        "ctrlrun/guard.py no longer builds the newest frozen guard: freeze a new version "
        "(python -m ctrlrun.guards.freeze N MIGRATION), add a migration that installs it, move guards.CURRENT on")
    assert guards.statements(guards.CURRENT, "postgresql") == guard._postgresql_statements()


@pytest.mark.parametrize("version", sorted(DIGESTS))
def test_a_frozen_version_is_never_edited(version):
    assert (_digest(version, "sqlite"), _digest(version, "postgresql")) == DIGESTS[version], (
        f"ctrlrun/guards/v{version}.py changed: a frozen version is never edited (make a new one)")


def test_every_version_is_pinned():
    assert sorted(DIGESTS) == list(guards.VERSIONS)


@pytest.mark.parametrize("version", list(guards.VERSIONS))
def test_each_version_is_installed_by_its_migration(version):
    """The migration a version names installs that version (forwards), nothing built today."""
    [path] = (REPO / "ctrlrun" / "migrations").glob(f"{guards.migration(version)}.py")
    text = path.read_text()
    assert re.search(rf"guards\.install\((schema_editor\.)?connection, {version}\)", text), path.name
    assert "guard.install" not in text and "from ctrlrun import guard\n" not in text, path.name


def test_no_migration_installs_todays_guard():
    for path in (REPO / "ctrlrun" / "migrations").glob("0*.py"):
        assert not re.search(r"\bguard\.(install|remove)\(", path.read_text()), path.name


@pytest.mark.parametrize("vendor", guards.VENDORS)
def test_the_version_record(vendor):
    [statement] = guards.record(7, vendor)
    assert "ctrlrun_guard_version" in statement and "SELECT 7" in statement
    assert guards.triggers(7, vendor) and all(name.startswith("ctrlrun_") for name, _ in guards.triggers(7, vendor))


def test_an_unknown_version_is_said():
    with pytest.raises(ValueError, match="there is no ctrlrun guard version 99"):
        guards.statements(99, "sqlite")


def test_the_frozen_versions_ship_in_the_wheel():
    from setuptools import find_packages

    assert "ctrlrun.guards" in find_packages(str(REPO), include=["ctrlrun*"])
    assert all((REPO / "ctrlrun" / "guards" / f"v{v}.py").is_file() for v in guards.VERSIONS)
