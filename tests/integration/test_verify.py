"""``verify`` (spec §F7) on both databases: a store used honestly grades pass; a store the application
role tampered with (plain SQL, as tests/support's role helpers do) fails the checks that rest on the
rows it changed; the guard dropped, the owner's connection, no chain check, observe mode and a bad
``--only`` each give their status. Every run is ``ctrlrun verify`` as its own OS process."""
from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

from tests.support import ROLE_POLICY, copy_row, scratch_store

pytestmark = pytest.mark.slow


@pytest.fixture(params=["sqlite", "postgresql"])
def vendor(request):
    return request.param


def _verify(store, *args: str) -> tuple[int, dict]:
    done = store.command("verify", "--json", *args)
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, (json.loads(done.stdout) if done.stdout.strip() else {"stderr": done.stderr})


def _status(document: dict) -> dict[str, str]:
    return {g["id"]: g["status"] for g in document["guarantees"]}


def _used(store) -> None:
    """A committed refund, a pending approval request (a refund above the allowed amount), a full check."""
    done = store.agent({"op": "refund", "payment_id": "t1", "amount": 60},
                       {"op": "refund", "payment_id": "t5", "amount": 5000}, {"op": "check"})
    assert done[0] == {"value": "refunded"} and done[1]["error"] == "ApprovalRequired" and done[2]["ok"], done


def test_an_honest_store_passes_every_applicable_check(vendor, tmp_path):
    with scratch_store(vendor, tmp_path, ROLE_POLICY, tag="verify") as store:
        _used(store)
        status, document = _verify(store, "--junit", str(tmp_path / "verify.xml"))
        text = store.command("verify")
    assert status == 0, document
    assert document["schema"] == "ctrlrun.verify/v1" and document["catalogue"] == "ctrlrun.guarantees/v7"
    assert document["store"] == {"backend": vendor, "scratch": False}
    assert document["authority"]["grants"] == ["support"]
    graded = _status(document)
    assert [i for i, s in graded.items() if s == "fail"] == []
    for gid in ("G1", "G2", "G3", "G4", "G5", "G6", "G7", "G8", "G9", "G10", "G11", "G12", "G18", "G22", "X1", "X2",
                "X4"):
        assert graded[gid] == "pass", (gid, document)
    assert graded["X3"] == ("pass" if vendor == "postgresql" else "not_applicable")
    assert graded["G13"] == ("pass" if vendor == "postgresql" else "not_applicable")
    assert all(g["reason"] for g in document["guarantees"])
    assert document["summary"]["badge"] == f"{document['summary']['passed']}/{document['summary']['applicable']}"
    suite = ET.parse(tmp_path / "verify.xml").getroot()
    assert suite.get("name") == "ctrlrun.verify" and suite.get("tests") == "36" and suite.get("failures") == "0"
    properties = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert properties["catalogue"] == "ctrlrun.guarantees/v7" and properties["policy_sha256"]
    assert text.returncode == 0 and "G3   duplicate effect refused" in text.stdout
    assert "declared guarantees pass." in text.stdout.splitlines()[-1]


def test_an_approval_granted_by_the_role_fails_the_approval_guarantees(vendor, tmp_path):
    with scratch_store(vendor, tmp_path, ROLE_POLICY, tag="verify") as store:
        _used(store)
        store.sql('UPDATE "ctrlrun_approval" SET "status" = \'granted\', "approver" = \'mallory\'')
        status, document = _verify(store)
    assert status == 1, document
    graded = _status(document)
    assert graded["G1"] == graded["G2"] == graded["G18"] == "fail", graded
    assert graded["G11"] == "pass" and graded["G3"] == "pass"  # the chains and effect records are intact
    failed = next(g for g in document["guarantees"] if g["id"] == "G1")
    first = failed["counterexample"][0]
    assert (first["kind"], first["name"]) == ("approval", "signature_invalid"), failed


def test_a_head_moved_and_an_effect_record_inserted_by_the_role_fail_their_checks(vendor, tmp_path):
    with scratch_store(vendor, tmp_path, ROLE_POLICY, tag="verify") as store:
        _used(store)
        copy_row(store, "ctrlrun_effectrecord", '"effect_key" = \'refund:t1\'', effect_key="refund:t9",
                 state="executing", lease_expires_at="2099-01-01 00:00:00")
        status, document = _verify(store)
        graded = _status(document)
        assert status == 1 and graded["G3"] == graded["G5"] == "fail" and graded["G11"] == "pass", document
        store.sql('UPDATE "ctrlrun_chainhead" SET "seq" = "seq" + 1')
        status, document = _verify(store)
    graded = _status(document)
    assert status == 1 and graded["G11"] == "fail", document
    g11 = next(g for g in document["guarantees"] if g["id"] == "G11")
    assert any(b["kind"] == "head" for b in g11["counterexample"]), g11


def test_a_dropped_trigger_fails_the_guard_check_and_what_rests_on_it(vendor, tmp_path):
    with scratch_store(vendor, tmp_path, ROLE_POLICY, tag="verify", as_role=False) as store:
        _used(store)
        if vendor == "sqlite":
            [[name]] = store.sql("SELECT name FROM sqlite_master WHERE type = 'trigger' ORDER BY name LIMIT 1")
            store.sql(f'DROP TRIGGER "{name}"')
        else:
            [[name, table]] = store.sql("SELECT t.tgname, c.relname FROM pg_trigger t JOIN pg_class c ON c.oid = "
                                        "t.tgrelid WHERE NOT t.tgisinternal ORDER BY 1 LIMIT 1")
            store.sql(f'DROP TRIGGER "{name}" ON "{table}"')
        status, document = _verify(store)
    graded = _status(document)
    assert status == 1 and graded["X1"] == "fail" and graded["G3"] == "fail", document
    x1 = next(g for g in document["guarantees"] if g["id"] == "X1")
    assert name in x1["reason"] and x1["counterexample"][0]["missing"] == [name]
    if vendor == "postgresql":  # the owner's own connection (a superuser here) can alter the triggers
        assert graded["X3"] == "fail" and "superuser" in next(
            g for g in document["guarantees"] if g["id"] == "X3")["reason"]


def test_no_chain_check_fails_x4_and_only_grades_what_it_names(vendor, tmp_path):
    with scratch_store(vendor, tmp_path, ROLE_POLICY, tag="verify") as store:
        assert store.agent({"op": "refund", "payment_id": "t1", "amount": 60}) == [{"value": "refunded"}]
        status, document = _verify(store, "--only", "X4")
        assert status == 1 and _status(document)["X4"] == "fail", document
        assert document["partial"] is True and document["summary"]["skipped"] == 35
        status, document = _verify(store, "--only", "g3,G6")
        assert status == 0 and [i for i, s in _status(document).items() if s != "skipped"] == ["G3", "G6"]
        bad = store.command("verify", "--only", "G99")
        assert bad.returncode == 2 and "G99" in bad.stderr and "G1, G2" in bad.stderr and "Traceback" not in bad.stderr
        none = store.command("verify", "--only", "G25")
        assert none.returncode == 2 and "nothing was graded" in none.stderr


def test_observe_mode_is_refused_with_exit_2(tmp_path):
    with scratch_store("sqlite", tmp_path, ROLE_POLICY.replace("schema: ctrlrun.policy/v7\n",
                                                               "schema: ctrlrun.policy/v7\nmode: observe\n"),
                       tag="verify") as store:
        done = store.command("verify")
    assert done.returncode == 2 and "observe mode" in done.stderr and "Traceback" not in done.stderr, done.stderr


@pytest.mark.usefixtures("store_db")
def test_manage_py_verify_grades_the_project_database(refund):
    """In a Django project: ``manage.py verify`` on the project's own database (the test run's, SQLite or
    PostgreSQL). The suite connects to PostgreSQL as its owner, a superuser: X3 names it."""
    from io import StringIO

    from django.core.management import CommandError, call_command
    from django.db import connection

    from tests.support import pay, run_command

    pay(refund, "txn_1")
    run_command("receipts", "--verify-chain")
    out = StringIO()
    try:
        call_command("verify", "--json", stdout=out, stderr=StringIO())
        status = 0
    except CommandError as exc:
        status = exc.returncode
    graded = _status(json.loads(out.getvalue()))
    assert graded["G3"] == graded["G11"] == graded["X1"] == graded["X4"] == "pass", graded
    if connection.vendor == "postgresql":
        assert (status, graded["X3"]) == (1, "fail")
    else:
        assert (status, graded["X3"]) == (0, "not_applicable")


def test_a_policy_that_does_not_load_and_an_unreachable_store_are_exit_2(tmp_path):
    with scratch_store("sqlite", tmp_path, ROLE_POLICY, tag="verify") as store:
        (tmp_path / "ctrlrun.yaml").write_text("schema: ctrlrun.policy/v7\nactions: [not, a, map]\n")
        broken = store.command("verify")
        (tmp_path / "ctrlrun.yaml").write_text(ROLE_POLICY)
        env = store.environment()
    assert broken.returncode == 2 and "Error:" in broken.stderr and "Traceback" not in broken.stderr, broken.stderr
    import subprocess
    import sys

    env.pop("CTRLRUN_STATE")
    env["CTRLRUN_STORE_URL"] = "postgresql://nobody@127.0.0.1:1/none"
    done = subprocess.run([sys.executable, "-m", "ctrlrun", "verify"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2 and "Error:" in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_a_policy_that_pins_an_upstream_grades_g27(vendor, tmp_path):
    """G27 applies once an entry pins its upstream (v8 ``upstream:``); without one it is not applicable."""
    pinned = ROLE_POLICY.replace("schema: ctrlrun.policy/v7", "schema: ctrlrun.policy/v8") + (
        "  mcp.shop.refund:\n"
        "    effect: \"refund:{payment_id}\"\n"
        "    decision: allow\n"
        "    upstream:\n"
        "      tool_schema_sha256: \"sha256:" + "ab" * 32 + "\"\n")
    with scratch_store(vendor, tmp_path, pinned, tag="verify") as store:
        _used(store)
        status, document = _verify(store, "--only", "G27")
    graded = {g["id"]: g for g in document["guarantees"]}
    assert status == 0 and graded["G27"]["status"] == "pass", document
    assert "mcp.shop.refund" in graded["G27"]["reason"] and "-41016" in graded["G27"]["reason"]
