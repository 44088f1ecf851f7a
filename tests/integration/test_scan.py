"""scan (§F5) and scan --coverage (§F6): unprotected consequential calls found by AST, suppressions that
need a reason, the policy compared, hostile source reported (never a traceback), text and ctrlrun.scan/v1,
and the policy actions no receipt names, as `manage.py scan` and as `ctrlrun scan` (another process)."""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

import ctrlrun
from ctrlrun import scan as finder
from ctrlrun.control import Control
from tests.support import REFUND_POLICY, store_environment

TOOLS = textwrap.dedent('''
    import ctrlrun
    import requests
    import stripe


    @ctrlrun.protect("stripe.refund", effect="refund:{payment_id}")
    def refund(payment_id, amount):
        return stripe.Refund.create(payment=payment_id, amount=amount)


    @ctrlrun.protect("crm.update")
    def update(x):
        return x


    def cleanup(k8s, name):
        k8s.delete_namespace(name)
        requests.post("https://hooks.example.com", json={})
        requests.get("https://example.com")


    def stop(s):
        s.cancel()  # ctrlrun: not-consequential
        s.cancel()  # ctrlrun: not-consequential — a local timer, nothing leaves the process


    def dynamic(client, name, control):
        getattr(client, name)()
        return control.call("audit.note", {"text": "x"}, lambda: send_mail("a", "b"))


    def later(key):
        return shutil.delete_tree(key)


    wrapped = ctrlrun.protect("email.send", effect="email:{key}")(later)
''')


def scan(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    try:
        call_command("scan", *args, stdout=out, stderr=err)
        code = 0
    except CommandError as exc:
        err.write(str(exc))
        code = exc.returncode
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def tree(tmp_path):
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "tools.py").write_text(TOOLS)
    return tmp_path


def test_the_reference_scenario_text(tree, use_policy):
    policy = use_policy(REFUND_POLICY + "  k8s.deploy:\n    decision: approve\n")
    (tree / "app" / "bad.py").write_text("def broken(:\n")
    code, out, _ = scan("--path", str(tree), "--policy", str(policy))
    assert code == 1
    lines = out.splitlines()
    assert lines[0] == f"ctrlrun scan — {tree}"
    assert "unprotected_call (3)" in lines
    assert "  app/tools.py:18  k8s.delete_namespace  [unprotected_call: vocabulary:delete]" in lines
    assert "  app/tools.py:19  requests.post  [unprotected_call: http-write:post]" in lines
    assert any(line.startswith("  app/tools.py:24  s.cancel  [unprotected_call: vocabulary:cancel]") for line in lines)
    assert "requests.get" not in out and "stripe.Refund.create" not in out and "send_mail" not in out
    assert "shutil.delete_tree" not in out  # wrapped by protect(...)(later)
    assert "  app/tools.py:13  crm.update  [protected_action_not_in_policy: not-in-policy]" in lines
    assert any("k8s.deploy  [action_without_effect: no-effect-template]" in line for line in lines)
    assert "  app/bad.py:1  not valid Python: invalid syntax  [unparseable: syntax-error]" in lines
    assert "undetermined (1)" in lines and "  app/tools.py:29  getattr(client, name)()" in lines
    assert "  app/tools.py:25  s.cancel  [vocabulary:cancel]  — a local timer, nothing leaves the process" in lines
    assert "files read 2 / excluded 0 / findings 6 / suppressed 1 / undetermined 1" in lines
    assert "vocabulary: 25 verbs (built-in)" in lines
    assert lines[-1] == finder_footer()


def finder_footer() -> str:
    from ctrlrun.scan_report import FOOTER

    return FOOTER


def test_the_json_document(tree, use_policy):
    policy = use_policy()
    code, out, _ = scan("--path", str(tree), "--policy", str(policy), "--json")
    document = json.loads(out)
    assert code == 1
    assert list(document)[:9] == ["schema", "root", "findings", "suppressed", "undetermined", "root_grant_holders",
                                  "totals", "vocabulary", "vocabulary_source"]
    assert document["schema"] == "ctrlrun.scan/v1"
    assert all(set(f) == {"kind", "file", "line", "rule", "target", "name", "detail"} for f in document["findings"])
    assert document["undetermined"] == [{"file": "app/tools.py", "line": 29, "expression": "getattr(client, name)()"}]
    assert document["totals"] == {"files_read": 1, "files_excluded": 0, "findings": 4, "suppressed": 1,
                                  "undetermined": 1}
    assert len(document["vocabulary"]) == 25


def test_clean_code_exits_0_and_exclude_counts(tmp_path, use_policy):
    (tmp_path / "ok.py").write_text("def add(a, b):\n    return a + b\n")
    (tmp_path / "gen").mkdir()
    (tmp_path / "gen" / "x.py").write_text("stripe.Refund.create()\n")
    (tmp_path / "skip.py").write_text("stripe.Refund.create()\n")
    code, out, _ = scan("--path", str(tmp_path), "--policy", str(use_policy()), "--exclude", "gen",
                        "--exclude", "skip.py")
    assert code == 0, out
    assert "files read 1 / excluded 1 / findings 0 / suppressed 0 / undetermined 0" in out


def test_vocabulary_printed_and_read_from_a_file(tmp_path, use_policy):
    code, out, _ = scan("--vocabulary")
    assert code == 0 and out.split() == list(finder.VOCABULARY)
    (tmp_path / "verbs.txt").write_text("# ours\nwire\n")
    (tmp_path / "pay.py").write_text("bank.wire_money(1)\nstripe.Refund.create()\n")
    code, out, _ = scan("--path", str(tmp_path), "--vocabulary", str(tmp_path / "verbs.txt"),
                        "--policy", str(use_policy()), "--exclude", "verbs.txt")
    assert code == 1 and "vocabulary:wire" in out and "refund" not in out.lower().split("vocabulary")[0]
    (tmp_path / "bad.txt").write_text("Two Words\n")
    code, _, err = scan("--vocabulary", str(tmp_path / "bad.txt"))
    assert code == 2 and "not one lower-case word" in err


def test_could_not_run_is_exit_2(tmp_path):
    code, _, err = scan("--path", str(tmp_path / "nope"))
    assert code == 2 and "no such file or folder" in err
    (tmp_path / "p.yaml").write_text("schema: [\n")
    code, _, err = scan("--path", str(tmp_path), "--policy", str(tmp_path / "p.yaml"))
    assert code == 2 and "--policy" in err


def test_hostile_source_is_reported_never_a_traceback(tmp_path, use_policy):
    """Undecodable bytes, NUL bytes, nesting deeper than the parser goes, a file past the size limit, a FIFO,
    a symlink loop of files and one of folders, a folder that cannot be read, a hidden file name."""
    (tmp_path / "binary.py").write_bytes(b"x = '\xff\xfe'\n")
    (tmp_path / "nul.py").write_bytes(b"x = 1\x00\n")
    (tmp_path / "cookie.py").write_bytes(b"# -*- coding: nonsense -*-\nx = 1\n")
    (tmp_path / "deep.py").write_text("x = " + "(" * 100_000 + ")" * 100_000 + "\n")
    (tmp_path / "chain.py").write_text("x = a" + ".b" * 1500 + ".refund()\n")  # deep for a recursive walk
    (tmp_path / "huge.py").write_bytes(b"#" * (finder.MAX_FILE_BYTES + 1))
    os.mkfifo(tmp_path / "fifo.py")
    (tmp_path / "loop1.py").symlink_to("loop2.py")
    (tmp_path / "loop2.py").symlink_to("loop1.py")
    (tmp_path / "up").symlink_to("..")  # a folder loop: never followed
    (tmp_path / "locked").mkdir()
    (tmp_path / "locked" / "x.py").write_text("stripe.Refund.create()\n")
    (tmp_path / "locked").chmod(0)
    (tmp_path / "evil\u202egnp.py").write_text("os.remove('x')\n")
    try:
        code, out, err = scan("--path", str(tmp_path), "--policy", str(use_policy()), "--json")
    finally:
        (tmp_path / "locked").chmod(0o755)
    assert "Traceback" not in out + err
    document = json.loads(out)
    found = {f["file"]: (f["rule"], f["detail"]) for f in document["findings"]}
    assert found["binary.py"][0] == "unreadable" and "encoding" in found["binary.py"][1]
    assert found["nul.py"][0] == "syntax-error"
    assert found["cookie.py"][0] == "unreadable"
    assert found["deep.py"][0] == "syntax-error"
    assert found["chain.py"][0] == "vocabulary:refund"  # named by a loop, not a recursion
    assert found["huge.py"] == ("unreadable", found["huge.py"][1]) and "larger than" in found["huge.py"][1]
    assert "not a regular file" in found["fifo.py"][1]
    assert "symbolic links" in found["loop1.py"][1]
    if os.geteuid() != 0:  # root reads a mode-0 folder anyway; then its file is scanned like any other
        assert found["locked"][0] == "unreadable"
    assert "evil\u202egnp.py" in found and code == 1
    assert "\\u202e" in out and "\u202e" not in out  # the name is shown escaped, JSON and text alike
    _, text, _ = scan("--path", str(tmp_path), "--policy", str(use_policy()))
    assert "evil\\u202egnp.py:1  os.remove" in text


def test_progress_on_long_scans(tmp_path, use_policy, monkeypatch):
    monkeypatch.setattr(finder, "PROGRESS_EVERY", 3)
    for n in range(7):
        (tmp_path / f"m{n}.py").write_text("x = 1\n")
    code, _, err = scan("--path", str(tmp_path), "--policy", str(use_policy()))
    assert code == 0
    assert [line for line in err.splitlines() if line.startswith("scan:")] == ["scan: 3 files read…",
                                                                                "scan: 6 files read…"]


def test_scanning_this_repository_never_fails():
    """Our own source: every file parses, and the finder runs to its end."""
    result = finder.scan(Path(__file__).resolve().parents[2] / "ctrlrun")
    assert result.files_read > 50
    assert not [f for f in result.findings if f.kind == "unparseable"]


# --------------------------------------------------------------------------- --coverage


@pytest.mark.usefixtures("store_db")
def test_coverage_lists_what_no_receipt_names(tree, settings):
    refund = ctrlrun.protect("stripe.refund", effect="refund:{payment_id}")(lambda payment_id, amount: "ok")
    with ctrlrun.context(agent="support-agent"):
        refund(payment_id="t1", amount=10)
    Control().call("email.send", {"msg_id": "m1"}, lambda: "sent", principal="mailer")
    code, out, _ = scan("--path", str(tree), "--coverage", "--json")
    document = json.loads(out)["coverage"]
    assert document["schema"] == "ctrlrun.coverage/v1" and document["policy"] == settings.CTRLRUN_POLICY
    assert document["receipts_read"] == 2 and document["actions_seen"] == 2
    unused = [(u["kind"], u["name"]) for u in document["unused"]]
    assert unused == [("policy_action", "audit.note"), ("policy_action", "iam.grant_admin"),
                      ("protected_action", "crm.update")]
    assert all("none of the 2 receipts" in u["reason"] for u in document["unused"])
    assert code == 1  # the source's findings; coverage never changes the exit code
    _, text, _ = scan("--path", str(tree), "--coverage")
    assert "never exercised (3)" in text and "  policy_action  audit.note  — " in text


def store_url() -> str:
    environment = store_environment()
    if connection.vendor == "sqlite":
        return f"sqlite:///{environment['CTRLRUN_STATE']}"
    return environment["CTRLRUN_STORE_URL"]


@pytest.mark.usefixtures("store_db")
def test_ctrlrun_scan_coverage_reads_the_store_url(tree):
    """The console script in its own process, pointed at the test store by --store-url alone."""
    Control().call("email.send", {"msg_id": "m2"}, lambda: "sent", principal="mailer")
    (tree / "ctrlrun.yaml").write_text(REFUND_POLICY)
    env = {k: v for k, v in store_environment().items() if k not in ("CTRLRUN_STATE", "CTRLRUN_STORE_URL")}
    result = subprocess.run([sys.executable, "-m", "ctrlrun", "scan", "--coverage", "--json", "--store-url",
                             store_url()], cwd=tree, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stderr
    coverage = json.loads(result.stdout)["coverage"]
    assert coverage["receipts_read"] == 1
    assert ("policy_action", "stripe.refund") in [(u["kind"], u["name"]) for u in coverage["unused"]]
    plain = subprocess.run([sys.executable, "-m", "ctrlrun", "scan", "--path", "app"], cwd=tree, env=env,
                           capture_output=True, text=True, timeout=120)
    assert plain.returncode == 1 and "Traceback" not in plain.stderr  # no store needed without --coverage
    assert not (tree / ".ctrlrun").exists()
    missing = subprocess.run([sys.executable, "-m", "ctrlrun", "scan", "--coverage"], cwd=tree, env=env,
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and "Error:" in missing.stderr and "Traceback" not in missing.stderr
