"""A stand-in remote and the refund protected in front of it, readers of the evidence, console
users, and OS processes started on the test store."""
from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest

import ctrlrun


REPO = Path(__file__).resolve().parent.parent.parent

#: One keyed action, allowed: the policy of the scripts that race OS processes for ``post:`` keys.
LEDGER_POLICY = """\
schema: ctrlrun.policy/v2
actions:
  ledger.post:
    effect: "post:{entry_id}"
    decision: allow
"""




# --------------------------------------------------------------------------- the remote and the agent's call


class Remote:
    """A stand-in remote API: records each call that reached it as (payment_id, amount), and loses the
    reply (raises ``fail_with``) when told to."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self.fail_with: BaseException | None = None

    def refund(self, payment_id: str, amount: int) -> dict:
        self.calls.append((payment_id, amount))
        if self.fail_with is not None:
            raise self.fail_with
        return {"id": f"re_{payment_id}", "amount": amount}


def protected_refund(remote: Remote, **options):
    """``remote.refund`` behind ``ctrlrun.protect("stripe.refund", effect="refund:{payment_id}", **options)``."""

    @ctrlrun.protect("stripe.refund", effect="refund:{payment_id}", **options)
    def refund(payment_id: str, amount: int) -> dict:
        return remote.refund(payment_id, amount)

    return refund


class Hook:
    """A reconcile hook that answers from a script (the last answer again and again; an exception
    is raised) and remembers what it was asked."""

    def __init__(self, *answers) -> None:
        self.answers = list(answers)
        self.asked: list[str] = []

    def __call__(self, effect_key: str):
        self.asked.append(effect_key)
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, BaseException):
            raise answer
        return answer


def make_ambiguous(refund, remote: Remote, payment_id: str = "txn_9", error: BaseException | None = None) -> str:
    """An allowed call of support-agent whose reply is lost: its effect key is left AMBIGUOUS. Returns the key.

    With ``error`` the remote raises that instead of a timeout (a ``NotExecuted`` leaves the key failed)."""
    remote.fail_with = error or TimeoutError("read timed out")
    with ctrlrun.context(agent="support-agent"), pytest.raises(type(remote.fail_with)):
        refund(payment_id=payment_id, amount=100)
    remote.fail_with = None
    return f"refund:{payment_id}"


def hold_key(key: str, *, action: str = "stripe.refund", action_id: str | None = None, minutes: float = 5):
    """Reserve ``key`` as another worker would (a real row, written through the store) under a lease
    of ``minutes``; returns the ``store.Reserved``."""
    from ctrlrun import conf, store

    principal = ctrlrun.Principal(agent="other-worker")
    arguments = {"payment_id": key.split(":", 1)[1], "amount": 1}
    ids = {} if action_id is None else {"action_id": action_id}
    held = ctrlrun.Action(action, arguments, principal, environment=conf.environment(), **ids)
    call = store.Call(held, ctrlrun.Decision.ALLOW, "rule[0]", None, key)
    taken = store.reserve(call, dt.timedelta(minutes=minutes), opening=True, hold_ambiguous=False)
    assert isinstance(taken, store.Reserved)
    return taken


# --------------------------------------------------------------------------- reading the evidence


def receipts() -> list[dict]:
    """Every receipt's document, in chain order."""
    from ctrlrun.models import Receipt

    return [json.loads(r.document) for r in Receipt.objects.order_by("seq")]


def events(action_id: str | None = None) -> list[str]:
    """The types of the events (of one action, if given), in the order written."""
    from ctrlrun.models import Event

    query = Event.objects.order_by("id")
    if action_id is not None:
        query = query.filter(action_id=action_id)
    return [e.type for e in query]


def event(type_: str, **filters):
    """The one event of this type (and these filters)."""
    from ctrlrun.models import Event

    return Event.objects.filter(type=type_, **filters).order_by("id").get()


def run_command(name: str, *args: str) -> list[str]:
    """Run a management command in-process; the lines it printed on stdout."""
    from django.core.management import call_command

    out, err = StringIO(), StringIO()
    call_command(name, *args, stdout=out, stderr=err)
    return out.getvalue().splitlines()


# --------------------------------------------------------------------------- console users

PASSWORD = "console-pass-1"
#: The groups `migrate` makes (ctrlrun.apps.create_console_groups), by the role their members play.
GROUPS = {"approver": "approvers", "resolver": "resolvers", "auditor": "auditors"}
USERNAMES = {"superuser": "root", "approver": "ana", "resolver": "rita", "auditor": "otto", "staff": "sam",
             "outsider": "olga"}


def make_user(role: str, username: str | None = None):
    """A console user: a superuser, a staff member of a migration-created group, staff alone, or not staff."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group

    User = get_user_model()
    name = username or USERNAMES[role]
    if role == "superuser":
        return User.objects.create_superuser(name, f"{name}@example.com", PASSWORD)
    user = User.objects.create_user(name, f"{name}@example.com", PASSWORD, is_staff=role != "outsider")
    if role in GROUPS:
        user.groups.add(Group.objects.get(name=GROUPS[role]))
    return user


# --------------------------------------------------------------------------- OS processes on the test store


def store_environment() -> dict[str, str]:
    """Environment variables that point a standalone ctrlrun process at the test database."""
    from django.db import connection

    settings_dict = connection.settings_dict
    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL",
                                                           "CTRLRUN_STORE_URL", "CTRLRUN_STATE")}
    env["PYTHONPATH"] = str(REPO)
    if connection.vendor == "sqlite":
        env["CTRLRUN_STATE"] = settings_dict["NAME"]
    else:
        user = settings_dict.get("USER") or "postgres"
        password = f":{settings_dict['PASSWORD']}" if settings_dict.get("PASSWORD") else ""
        host = settings_dict.get("HOST") or "127.0.0.1"
        port = settings_dict.get("PORT") or 5432
        env["CTRLRUN_STORE_URL"] = f"postgresql://{user}{password}@{host}:{port}/{settings_dict['NAME']}"
    return env


def script_environment(folder: Path, policy: str) -> dict[str, str]:
    """``store_environment()`` for a script run in ``folder`` under ``policy`` (written there as ctrlrun.yaml)."""
    (folder / "ctrlrun.yaml").write_text(policy)
    env = store_environment()
    env["CTRLRUN_CONFIG"] = str(folder / "ctrlrun.yaml")
    return env


def run_together(folder: Path, script: str, argument_lists: list[list[str]], env: dict[str, str],
                 timeout: float = 180) -> list[str]:
    """Start ``script`` once per argument list, all at once, in ``folder``; wait for every one, check
    each exited 0 (its stderr as the message) and return what each printed."""
    procs = [
        subprocess.Popen([sys.executable, script, *arguments], cwd=folder, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for arguments in argument_lists
    ]
    outputs = [p.communicate(timeout=timeout) for p in procs]
    for proc, (out, err) in zip(procs, outputs):
        assert proc.returncode == 0, err
    return [out for out, _ in outputs]


def evidence_guard():
    """The module that installs and removes the database's guard (append-only evidence, state tables)."""
    from ctrlrun import guard

    return guard


class evidence_unguarded:
    """Drop the append-only triggers for a block, as an attacker with DDL rights could, then restore them."""

    def __enter__(self):
        from django.db import connection

        evidence_guard().remove(connection)

    def __exit__(self, *exc):
        from django.db import connection

        evidence_guard().install(connection)
        return False
