"""``manage.py notify``: its help, and ``--loop`` as an OS process sending a due mail over a real SMTP
server on loopback, logging the pass with its time, and stopping cleanly on Ctrl-C (SIGINT)."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest
from django.db import connection

from ctrlrun import notify, store
from tests.support import REPO, SmtpServer, ask, make_user

pytestmark = [pytest.mark.usefixtures("store_db", "console_groups"), pytest.mark.slow]


def _project(tmp_path, port: int) -> dict[str, str]:
    """A settings module for a child process on the test database, mailing through 127.0.0.1:``port``."""
    (tmp_path / "notify_settings.py").write_text(
        "from tests.settings import *  # noqa\n"
        f"DATABASES['default']['NAME'] = {connection.settings_dict['NAME']!r}\n"
        "EMAIL_BACKEND = 'django.core.mail.backends.smtp.EmailBackend'\n"
        f"EMAIL_HOST, EMAIL_PORT, EMAIL_TIMEOUT = '127.0.0.1', {port}, 10\n"
        "CTRLRUN_NOTIFY_BASE_URL = 'https://ops.example.test'\n")
    env = {k: v for k, v in os.environ.items() if k not in ("CTRLRUN_STATE", "CTRLRUN_STORE_URL")}
    env.update(PYTHONPATH=f"{REPO}{os.pathsep}{tmp_path}", DJANGO_SETTINGS_MODULE="notify_settings")
    return env


def test_the_help_says_what_it_does(tmp_path):
    done = subprocess.run([sys.executable, str(REPO / "manage.py"), "notify", "--help"], env=_project(tmp_path, 25),
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
                                env=_project(tmp_path, smtp.port), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
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
