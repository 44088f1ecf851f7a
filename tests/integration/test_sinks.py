"""The JSONL sink (§A2): receipts.jsonl and events.jsonl written after commit, every line valid JSON on one
line with hidden characters escaped, and a failing write (a full disk) logged, kept and written later,
never failing the agent's call."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap

import pytest

import ctrlrun
from ctrlrun import observers
from ctrlrun.control import Control
from ctrlrun.sinks import JSONLEventSink
from tests.support import receipts as stored_receipts

pytestmark = pytest.mark.usefixtures("store_db")

EVENT_KEYS = ["event_id", "ts", "type", "action_id", "effect_key", "approval_id", "data"]


def lines(path) -> list[dict]:
    text = path.read_text(encoding="utf-8")
    assert text == "" or text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]


def test_a_call_writes_its_receipt_and_events(tmp_path):
    sink = JSONLEventSink(tmp_path / "evidence")
    control = Control(observers=[sink])
    control.call("email.send", {"msg_id": "m1"}, lambda: "sent", principal="mailer")
    assert sink.receipts_path == tmp_path / "evidence" / "receipts.jsonl"
    [receipt] = lines(sink.receipts_path)
    assert receipt == stored_receipts()[-1]
    assert list(receipt) == list(stored_receipts()[-1])  # key order, not sorted
    events = lines(sink.events_path)
    assert [e["type"] for e in events] == ["ACTION_PROPOSED", "POLICY_EVALUATED", "EFFECT_RESERVED",
                                           "EXECUTION_STARTED", "EXECUTION_COMMITTED"]
    assert all(list(e) == EVENT_KEYS for e in events)
    assert [e["event_id"] for e in events] == sorted(e["event_id"] for e in events)
    assert events[0]["action_id"] == receipt["action_id"] and events[0]["ts"].endswith("Z")


def test_hidden_characters_are_escaped_and_each_record_stays_one_line(tmp_path):
    """A bidi override, a line separator and a newline in an argument: escaped, one valid line per record."""
    sink = JSONLEventSink(tmp_path)
    hostile = "txn_1\u202e0001\u2028\n\x1b[2Jx"
    Control(observers=[sink]).call("email.send", {"msg_id": hostile}, lambda: "sent", principal="mailer")
    raw = sink.receipts_path.read_text(encoding="utf-8")
    assert raw.count("\n") == 1
    for char in ("\u202e", "\u2028", "\x1b"):
        assert char not in raw and char not in sink.events_path.read_text(encoding="utf-8")
    assert "\\u202e" in raw
    [receipt] = lines(sink.receipts_path)
    assert receipt["arguments"]["msg_id"] == hostile  # the escapes read back as the same value


def test_a_full_disk_never_fails_the_call_and_nothing_is_lost(tmp_path, caplog):
    """/dev/full refuses every write with ENOSPC: the calls succeed, the failure is logged, and once the
    file is writable again the waiting lines go out first, in order."""
    sink = JSONLEventSink(tmp_path)
    sink.receipts_path.symlink_to("/dev/full")
    control = Control(observers=[sink])
    with caplog.at_level(logging.ERROR, logger="ctrlrun.sinks"):
        for n in range(3):
            assert control.call("email.send", {"msg_id": f"m{n}"}, lambda: "sent", principal="mailer") == "sent"
    assert "No space left on device" in caplog.text
    assert sink.pending == 3
    sink.receipts_path.unlink()
    assert sink.flush() is True and sink.pending == 0
    assert [r["arguments"]["msg_id"] for r in lines(sink.receipts_path)] == ["m0", "m1", "m2"]
    assert len(lines(sink.events_path)) == 15


def test_an_unwritable_directory_is_logged_and_the_call_goes_on(tmp_path, caplog):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    sink = JSONLEventSink(blocker / "evidence", max_pending=1)
    with caplog.at_level(logging.ERROR, logger="ctrlrun.sinks"):
        for n in range(3):
            Control(observers=[sink]).call("email.send", {"msg_id": f"u{n}"}, lambda: "sent", principal="mailer")
    assert "could not append" in caplog.text and "dropped" in caplog.text
    assert sink.pending == 2 and sink.dropped > 0  # one line kept per file; the store has them all
    assert len(stored_receipts()) == 3


def test_a_registered_sink_hears_a_person_approving(tmp_path):
    """The console's and the commands' writes reach a process sink (the reference skips its sink for them)."""
    sink = JSONLEventSink(tmp_path)
    observers.register(sink)
    try:
        with ctrlrun.context(agent="support-agent"), pytest.raises(ctrlrun.ApprovalRequired) as asked:
            Control().call("stripe.refund", {"payment_id": "big", "amount": 200_000}, lambda: None)
        from ctrlrun import store

        store.answer_approval(asked.value.request_id, True, by="alice")
    finally:
        observers.unregister(sink)
    types = [e["type"] for e in lines(sink.events_path)]
    assert types[-2:] == ["APPROVAL_REQUESTED", "APPROVAL_GRANTED"]


PARTIAL_WRITE = textwrap.dedent("""
    import os, resource, signal, sys
    from pathlib import Path
    from ctrlrun.sinks import _Appender
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # over the limit: EFBIG, not a killed process
    path = Path(sys.argv[1])
    appender = _Appender(path, 10)
    assert appender.append('{"first":1}')
    size = path.stat().st_size
    resource.setrlimit(resource.RLIMIT_FSIZE, (size + 10, resource.RLIM_INFINITY))
    assert not appender.append('{"second":"' + "x" * 100 + '"}')  # 10 bytes fit, then EFBIG
    print(path.stat().st_size == size, len(appender.pending))
""")


def test_a_partial_write_leaves_no_torn_line(tmp_path):
    """A write cut short (the file size limit, as a full disk cuts one) is removed again: the file holds
    whole lines only, and the line waits for the next write. Its own process: the limit is per process."""
    path = tmp_path / "events.jsonl"
    result = subprocess.run([sys.executable, "-c", PARTIAL_WRITE, str(path)], capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": os.getcwd()}, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "1"]
    assert [json.loads(line) for line in path.read_text().splitlines()] == [{"first": 1}]


APPENDER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from ctrlrun.sinks import _Appender
    appender = _Appender(Path(sys.argv[1]), 10)
    for n in range(150):
        assert appender.append('{"writer":%s,"n":%d,"pad":"%s"}' % (sys.argv[2], n, "x" * 6000))
""")


@pytest.mark.slow
def test_processes_appending_together_never_interleave(tmp_path):
    """Four OS processes append 6 KB lines to one file at once: every line whole, none lost."""
    path = tmp_path / "events.jsonl"
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    procs = [subprocess.Popen([sys.executable, "-c", APPENDER, str(path), str(w)], env=env) for w in range(4)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0, 0]
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(records) == 600
    for writer in range(4):
        assert [r["n"] for r in records if r["writer"] == writer] == list(range(150))


@pytest.mark.slow
def test_the_jsonl_dir_setting_registers_a_process_sink(run_script, tmp_path):
    """$CTRLRUN_JSONL_DIR (the CTRLRUN_JSONL_DIR setting in a project): every write of the process, no code."""
    result = run_script("""
        import ctrlrun
        from ctrlrun.control import Control
        print(Control().call("email.send", {"msg_id": "env-1"}, lambda: "sent", principal="mailer"))
    """, CTRLRUN_JSONL_DIR=str(tmp_path / "evidence"))
    assert result.returncode == 0, result.stderr
    [receipt] = lines(tmp_path / "evidence" / "receipts.jsonl")
    assert receipt["arguments"] == {"msg_id": "env-1"} and receipt == stored_receipts()[-1]
    assert len(lines(tmp_path / "evidence" / "events.jsonl")) == 5
