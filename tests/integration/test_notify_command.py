"""``manage.py notify``: its help, and ``--loop`` as an OS process sending a due mail over a real SMTP
server on loopback, logging the pass with its time, and stopping cleanly on Ctrl-C (SIGINT)."""
from __future__ import annotations

import re
import signal
import subprocess
import sys
import time

import pytest

from ctrlrun import notify, store
from tests.support import REPO, SmtpServer, ask, make_user, notify_project

pytestmark = [pytest.mark.usefixtures("store_db", "console_groups"), pytest.mark.slow]


def test_the_help_says_what_it_does(tmp_path):
    done = subprocess.run([sys.executable, str(REPO / "manage.py"), "notify", "--help"], env=notify_project(tmp_path, 25),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    for words in ("--loop", "--interval", "--limit", "CTRLRUN_NOTIFY_MAX_ATTEMPTS", "Ctrl-C"):
        assert words in done.stdout, words


def test_the_loop_sends_a_due_mail_logs_it_and_stops_on_ctrl_c(tmp_path, settings, refund):
    settings.CTRLRUN_NOTIFY_BASE_URL, settings.CTRLRUN_NOTIFY_AT_ONCE = "https://ops.example.test", False
    make_user("approver", "ana")
    notify.connect_signal_receiver()
    try:
        request_id = ask(refund, "txn_loop")  # recorded, left to the loop
    finally:
        notify.disconnect_signal_receiver()
    assert [d.status for d in store.notifications.deliveries_for(request_id)] == ["pending"]
    with SmtpServer() as smtp:
        loop = subprocess.Popen([sys.executable, str(REPO / "manage.py"), "notify", "--loop", "--interval", "0.2"],
                                env=notify_project(tmp_path, smtp.port), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        try:
            for _ in range(1800):  # bounded: three minutes at most; until the loop recorded the mail sent
                if loop.poll() is not None or store.notifications.deliveries_for(request_id)[0].status == "sent":
                    break
                time.sleep(0.1)
            assert smtp.mails and smtp.mails[0]["To"] == "ana@example.com"
        finally:
            loop.send_signal(signal.SIGINT)
            out, err = loop.communicate(timeout=60)
    assert loop.returncode == 0, err
    lines = out.splitlines()
    assert lines[-1] == "stopped"
    assert any(re.fullmatch(r"\d{4}-\d\d-\d\dT[\d:.]+Z INFO ctrlrun\.notify: 1 sent", line) for line in lines), out
    assert store.notifications.deliveries_for(request_id)[0].status == "sent"


def test_two_passes_at_once_send_each_mail_once(tmp_path, settings, refund):
    """Two ``notify`` processes started together on the same due mails: each attempt is claimed in its
    own transaction before the mail leaves, so every approver gets one mail, not two."""
    settings.CTRLRUN_NOTIFY_BASE_URL, settings.CTRLRUN_NOTIFY_AT_ONCE = "https://ops.example.test", False
    names = [f"approver{n}" for n in range(6)]
    for name in names:
        make_user("approver", name)
    notify.connect_signal_receiver()
    try:
        request_id = ask(refund, "txn_twice")
    finally:
        notify.disconnect_signal_receiver()
    with SmtpServer() as smtp:
        env = notify_project(tmp_path, smtp.port)
        passes = [subprocess.Popen([sys.executable, str(REPO / "manage.py"), "notify"], env=env, text=True,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
        done = [p.communicate(timeout=180) for p in passes]
    assert all(p.returncode == 0 for p in passes), done
    assert sorted(m["To"] for m in smtp.mails) == sorted(f"{n}@example.com" for n in names)
    assert {(d.status, d.attempts) for d in store.notifications.deliveries_for(request_id)} == {("sent", 1)}
