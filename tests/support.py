"""Plain helpers shared by the tests: a stand-in remote and the refund protected in front of it,
readers of the evidence, console users, and OS processes started on the test store.

The fixtures built on these live in ``tests/conftest.py``.
"""
from __future__ import annotations

import datetime as dt
import json
import os
import re
import subprocess
import sys
from io import StringIO
from pathlib import Path
from typing import Any

import pytest

import ctrlrun

REPO = Path(__file__).resolve().parent.parent

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


# --------------------------------------------------------------------------- the application's database role

#: A policy with authority (a delegable grant with an amount budget) over one keyed refund, for the
#: attacks of the application's database role (``tests/integration/test_role_matrix.py``).
ROLE_POLICY = """\
schema: ctrlrun.policy/v7
authority:
  grants:
    - id: support
      subject: {agent: support-agent}
      actions: ["stripe.refund"]
      delegable: true
      expires_at: "2099-01-01T00:00:00Z"
      budgets:
        - {metric: amount, limit: 100, window: P1D}
actions:
  stripe.refund:
    effect: "refund:{payment_id}"
    rules:
      - when: { amount_lte: 1000 }
        decision: allow
      - decision: approve
"""

#: The agent of those attacks, as an OS process: ``role_agent.py FOLDER OPS_JSON`` runs each
#: operation in turn and prints one JSON list of what each gave (a value, or the refusal).
ROLE_AGENT = r'''
import json, pathlib, sys
import ctrlrun

folder = pathlib.Path(sys.argv[1])
operations = json.loads(sys.argv[2])

@ctrlrun.protect("stripe.refund", effect="refund:{payment_id}")
def refund(payment_id: str, amount: int) -> str:
    with open(folder / "remote.log", "a") as log:
        log.write(f"{payment_id} {amount}\n")
    if (folder / f"lose-{payment_id}").exists():
        raise TimeoutError("read timed out")
    return "refunded"

from ctrlrun import resumption

@resumption.resumer("matrix")
def resume_matrix(run, answer):
    with open(folder / "resumed.log", "a") as log:
        log.write(f"{run.approval_id} {answer.status}\n")

def run(op):
    kind = op["op"]
    if kind == "refund":
        with ctrlrun.context(agent=op.get("agent", "support-agent")):
            if op.get("approval"):
                with ctrlrun.with_approval(op["approval"]):
                    return {"value": refund(payment_id=op["payment_id"], amount=op["amount"])}
            return {"value": refund(payment_id=op["payment_id"], amount=op["amount"])}
    ctrlrun.setup()
    from ctrlrun import store
    if kind == "delegate":
        from ctrlrun.control import default_control
        made = default_control().delegate(op["parent"], op["grant"], by=op.get("by", "support-agent"))
        return {"value": made.id}
    if kind == "pause":
        return {"value": store.save_paused_run(op["approval"], "pydantic-ai", '{"messages": []}', "matrix").id}
    if kind == "answer":
        store.answer_approval(op["approval"], op.get("granted", True), by="alice")
        return {"value": "answered"}
    if kind == "resume":
        return [[o.status, o.detail] for o in resumption.resume_ready()]
    if kind == "check":
        report, _ = store.run_check(incremental=op.get("incremental", False), ran_by="role-agent")
        return {"ok": report.ok, "breaks": [[b.name, b.kind] for b in report.breaks]}
    if kind == "last_check":
        view = store.last_check()
        return None if view is None else {"id": view.id, "ok": view.ok, "signature_ok": view.signature_ok}
    if kind == "verify":
        report = store.verify()
        return {"ok": report.ok, "breaks": [[b.name, b.kind] for b in report.breaks]}
    raise SystemExit(f"unknown operation {kind!r}")

out = []
for op in operations:
    try:
        out.append(run(op))
    except ctrlrun.CTRLRunError as exc:
        out.append({"error": type(exc).__name__, "reason": getattr(exc, "reason", None), "message": str(exc)})
    except TimeoutError:
        out.append({"error": "TimeoutError"})
print(json.dumps(out))
'''


class RoleStore:
    """One scratch store, and plain SQL on it as the application's database role: on PostgreSQL a
    real role with SELECT/INSERT/UPDATE/DELETE on the tables (and the sequences), owning nothing;
    on SQLite a plain connection to the file (no signing key, no DDL). The agent runs as OS
    processes (``agent``); ``sql`` is the attacker."""

    def __init__(self, vendor: str, folder: Path, *, url: str | None = None, path: Path | None = None,
                 policy: str = ROLE_POLICY) -> None:
        self.vendor, self.folder, self.url, self.path = vendor, folder, url, path
        (folder / "ctrlrun.yaml").write_text(policy)
        (folder / "role_agent.py").write_text(ROLE_AGENT)

    def environment(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if k not in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL", "CTRLRUN_STORE_URL", "CTRLRUN_STATE",
                            "CTRLRUN_CONFIG", "CTRLRUN_AUTHORITY")}
        env.update(PYTHONPATH=str(REPO), CTRLRUN_CONFIG=str(self.folder / "ctrlrun.yaml"))
        if self.vendor == "sqlite":
            env["CTRLRUN_STATE"] = str(self.path)
        else:
            env["CTRLRUN_STORE_URL"] = str(self.url)
        return env

    def agent(self, *operations: dict) -> list:
        """Run ``operations`` in one agent process; what each gave."""
        done = subprocess.run([sys.executable, str(self.folder / "role_agent.py"), str(self.folder),
                               json.dumps(list(operations))], cwd=self.folder, env=self.environment(),
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout.strip().splitlines()[-1])

    def one(self, operation: dict) -> object:
        return self.agent(operation)[0]

    def command(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "ctrlrun", *args], cwd=self.folder, env=self.environment(),
                              capture_output=True, text=True, timeout=300)

    def verify(self) -> dict:
        """``receipts --verify-chain --json``, run as the agent's own process would."""
        return json.loads(self.command("receipts", "--verify-chain", "--json").stdout)

    def connect(self):
        if self.vendor == "sqlite":
            import sqlite3

            return sqlite3.connect(self.path, timeout=30, isolation_level=None)
        import psycopg

        return psycopg.connect(self.url, autocommit=True)

    def sql(self, statement: str, *params) -> list:
        """Run one statement as the application role; the rows it returned (if any). Placeholders are
        ``%s`` on both databases."""
        if self.vendor == "sqlite":
            statement = statement.replace("%s", "?")
        connection = self.connect()
        try:
            cursor = connection.execute(statement, params)
            return list(cursor.fetchall()) if cursor.description else []
        finally:
            connection.close()

    def remote(self) -> list[str]:
        path = self.folder / "remote.log"
        return path.read_text().splitlines() if path.exists() else []


def role_refused(store: RoleStore):
    """The error the database raises when the guard refuses a statement (either database)."""
    if store.vendor == "sqlite":
        import sqlite3

        return sqlite3.DatabaseError
    import psycopg

    return psycopg.Error


def breaks(report: dict) -> list[tuple[str, str]]:
    """(name, kind) of each break a ``--verify-chain --json`` report names."""
    return [(b["name"], b["kind"]) for b in report["breaks"]]


def rewrite_paused(approval_id: str, /, **fields) -> None:
    """Rewrite columns of the run paused on ``approval_id`` as someone holding the signing key would
    (re-signed): what is left to stop an edited run is the grant at the effect. Without the key the row
    is never resumed at all (``test_an_edited_state_without_the_key_is_never_resumed``)."""
    from ctrlrun.models import PausedRun
    from ctrlrun.store.signatures import paused_mac

    row = PausedRun.objects.get(approval_id=approval_id)
    for name, value in fields.items():
        setattr(row, name, value)
    row.mac = paused_mac(row)
    with evidence_unguarded():  # the database refuses the application's role this change
        row.save(update_fields=[*fields, "mac"])


def write_paused_state(approval_id: str, state: str) -> None:
    """``rewrite_paused`` of the state alone."""
    rewrite_paused(approval_id, state=state)

# --------------------------------------------------------------------------- what the machine must have


def in_ci() -> bool:
    """CI runs every test: there, a missing system package is a failure, never a skip (.ci/run sets CI=true)."""
    return bool(os.environ.get("CI", "").strip())


def missing_system_package(reason: str) -> None:
    """Skip a test whose system package is missing, in one line naming what to install; fail it in CI."""
    if in_ci():
        pytest.fail(f"{reason} (CI is set, so this is a failure, not a skip)", pytrace=False)
    pytest.skip(reason)


#: The console's browser tests: Debian's Chromium and its ChromeDriver, found on PATH.
BROWSER = ("chromium", "chromedriver")
BROWSER_NEEDED = ("the console's browser tests need Debian's chromium and chromium-driver: "
                  "apt-get install chromium chromium-driver")
FAKETIME_NEEDED = "this test runs a process under a skewed clock: apt-get install faketime"
#: The PostgreSQL server the tests' scratch databases are made on (trust auth, user postgres).
POSTGRES_ADMIN_URL = os.environ.get("CTRLRUN_TEST_POSTGRES_ADMIN", "postgresql://postgres@127.0.0.1:5432/postgres")
POSTGRES_NEEDED = ("this test makes scratch databases on a PostgreSQL server at 127.0.0.1:5432 (user postgres, trust "
                   "auth): apt-get install postgresql, then start it (.ci/run does)")


def require_browser() -> tuple[str, str]:
    """The paths of ``chromium`` and ``chromedriver`` on PATH; else a skip (a failure in CI)."""
    import shutil

    found = tuple(shutil.which(program) for program in BROWSER)
    if not all(found):
        missing_system_package(BROWSER_NEEDED)
    return found  # type: ignore[return-value]


def require_faketime() -> str:
    import shutil

    found = shutil.which("faketime")
    if not found:
        missing_system_package(FAKETIME_NEEDED)
    return found  # type: ignore[return-value]


def require_postgresql() -> None:
    """A PostgreSQL server takes connections at :data:`POSTGRES_ADMIN_URL`; else a skip (a failure in CI)."""
    import psycopg

    try:
        with psycopg.connect(POSTGRES_ADMIN_URL, connect_timeout=10):
            pass
    except psycopg.OperationalError:
        missing_system_package(POSTGRES_NEEDED)


# ------------------------------------------------------------- site25: a fresh startproject, from the README

#: The venv's own ``django-admin`` (the one beside this Python).
DJANGO_ADMIN = Path(sys.executable).with_name("django-admin")


def readme_django_section() -> str:
    """The README's "In a Django project" section (up to the next ``## `` heading)."""
    readme = (REPO / "README.md").read_text()
    return readme.split("## In a Django project\n", 1)[1].split("\n## ", 1)[0]


def readme_recipe() -> dict[str, Any]:
    """What the README's Django section tells a reader to do, parsed from it (a test of it breaks when
    the README changes): ``settings`` (the lines for settings.py), ``template_path`` and ``template``
    (the front page), ``serving`` (the settings lines to serve it under gunicorn) and ``commands``
    (the serving block's ``$ `` lines, in order)."""
    import re

    section = readme_django_section()
    settings = re.findall(r"```python fragment\n(# settings\.py.*?)```", section, re.S)
    template = re.search(r"```html\+django\n(.*?)```", section, re.S)
    path = re.search(r"save this\s+as `([^`]+\.html)`", section)
    assert settings and template and path, "the README's Django recipe has no settings block, template or path"
    serving = [block for block in settings[1:] if "whitenoise" in block]
    commands = [line[2:] for block in re.findall(r"```text\n(.*?)```", section, re.S) if "gunicorn" in block
                for line in block.splitlines() if line.startswith("$ ")]
    return {"settings": settings[0], "template_path": path.group(1), "template": template.group(1),
            "serving": serving[0] if serving else "", "commands": commands}


def startproject_environment() -> dict[str, str]:
    """This environment without the tests' settings: the fresh project's own, and the installed ctrlrun."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CTRLRUN_", "DJANGO_")) and k != "DATABASE_URL"}
    env["PYTHONPATH"] = ""
    return env


class StartprojectSite:
    """``django-admin startproject mysite`` in ``folder``, with the README's lines applied as written."""

    def __init__(self, folder: Path, *, policy: str | None, serving: bool = False) -> None:
        self.folder = Path(folder)
        self.env = startproject_environment()
        self.recipe = readme_recipe()
        subprocess.run([str(DJANGO_ADMIN), "startproject", "mysite", str(self.folder)], check=True, env=self.env,
                       timeout=120, capture_output=True)
        settings = self.folder / "mysite" / "settings.py"
        added = self.recipe["settings"] + ("\n" + self.recipe["serving"] if serving else "")
        settings.write_text(settings.read_text() + "\n" + added)
        template = self.folder / self.recipe["template_path"]
        template.parent.mkdir(parents=True, exist_ok=True)
        template.write_text(self.recipe["template"])
        if policy is not None:
            (self.folder / "ctrlrun.yaml").write_text(policy)

    def manage(self, *args: str, timeout: float = 300, env: dict[str, str] | None = None,
               ) -> subprocess.CompletedProcess:
        """``python manage.py ARGS`` in the project, its output captured (never raises on an exit code)."""
        return subprocess.run([sys.executable, str(self.folder / "manage.py"), *args], cwd=self.folder,
                              env={**self.env, **(env or {})}, capture_output=True, text=True, timeout=timeout)

    def shell(self, code: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return self.manage("shell", "-c", code, timeout=timeout)


# --------------------------------------------------------------------------- budget25: a call held open in another process

#: A script (run as ``python held.py FOLDER NAME ARGUMENTS_JSON AGENT``) that makes one call through the
#: default Control whose executor writes FOLDER/started and then waits until FOLDER/release exists: while
#: it waits, its attempt is executing and its budget charges are held, in a process of its own.
HELD_CALL = """
import json, pathlib, sys, time
import ctrlrun
ctrlrun.setup()
from ctrlrun.control import default_control

folder = pathlib.Path(sys.argv[1])

def executor():
    (folder / "started").write_text("1")
    while not (folder / "release").exists():
        time.sleep(0.02)
    return "done"

print(default_control().call(sys.argv[2], json.loads(sys.argv[3]), executor, principal=sys.argv[4]))
"""


def start_held_call(folder: Path, policy: str, name: str, arguments: dict, agent: str,
                    seconds: float = 120) -> subprocess.Popen:
    """Start :data:`HELD_CALL` in ``folder`` under ``policy`` on the test store and return once its executor
    runs (its charges are held); write ``folder / "release"`` to let it commit."""
    import time

    env = script_environment(folder, policy)
    (folder / "held.py").write_text(HELD_CALL)
    process = subprocess.Popen([sys.executable, "held.py", str(folder), name, json.dumps(arguments), agent],
                               cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + seconds
    while not (folder / "started").exists():
        if process.poll() is not None:
            raise AssertionError(f"the held call exited early: {process.communicate()}")
        assert time.monotonic() < deadline, "the held call never started its executor"
        time.sleep(0.02)
    return process


#: A delegable grant whose budgets are money (``currency: EUR``) and a delegation of it with tighter budgets
#: of its own: the Grants, Delegations and ``inspect --grant`` views of delegated budgets.
BUDGETED_DELEGATION_POLICY = """\
schema: ctrlrun.policy/v7
authority:
  grants:
    - id: support
      subject: {agent: orchestrator}
      actions: [stripe.refund]
      delegable: true
      expires_at: "2099-01-01T00:00:00Z"
      budgets:
        - {metric: amount, limit: 500000, window: P1D, currency: EUR}
        - {metric: count, limit: 20, window: PT1H}
actions:
  stripe.refund:
    effect: "refund:{payment_id}"
    decision: allow
"""
BUDGETED_CHILD = """\
subject: {agent: worker}
actions: [stripe.refund]
expires_at: "2098-12-31T00:00:00Z"
budgets:
  - {metric: amount, limit: 100000, window: P2D, currency: EUR}
  - {metric: count, limit: 5, window: PT1H}
"""


# --------------------------------------------------------------------------- kernel25: approvals given back

#: Approvals given back (issue 25): a keyed refund that needs a person above 1000, no authority (so an
#: approved refund can commit in a scratch store).
GIVE_BACK_POLICY = """\
schema: ctrlrun.policy/v2
actions:
  stripe.refund:
    effect: "refund:{payment_id}"
    rules:
      - when: { amount_lte: 1000 }
        decision: allow
      - decision: approve
"""

_SENT = '    with open(folder / "remote.log", "a") as log:\n        log.write(f"{payment_id} {amount}\\n")\n'
assert _SENT in ROLE_AGENT
#: ``ROLE_AGENT`` whose refund raises ``NotExecuted`` before sending while ``refuse-<payment_id>`` exists.
GIVE_BACK_AGENT = ROLE_AGENT.replace(_SENT, '    if (folder / f"refuse-{payment_id}").exists():\n'
                                            '        raise ctrlrun.NotExecuted("connection refused")\n' + _SENT)


class scratch_role_store:
    """A scratch store under ``policy`` reached as the application role (``RoleStore``), with the agent
    of ``GIVE_BACK_AGENT``: on PostgreSQL a new database its owner migrated and a role with only
    SELECT/INSERT/UPDATE/DELETE (both dropped afterwards); on SQLite a new file."""

    def __init__(self, vendor: str, folder: Path, policy: str = GIVE_BACK_POLICY) -> None:
        import uuid

        self.vendor, self.folder, self.policy = vendor, folder, policy
        suffix = uuid.uuid4().hex[:8]
        self.name, self.role = f"ctrlrun_giveback_{suffix}", f"ctrlrun_giveback_app_{suffix}"

    def _admin(self, statement: str) -> None:
        import psycopg

        with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as admin:
            admin.execute(statement)

    def __enter__(self) -> RoleStore:
        if self.vendor == "sqlite":
            made = RoleStore("sqlite", self.folder, path=self.folder / "store.db", policy=self.policy)
        else:
            import psycopg

            require_postgresql()
            self._admin(f'CREATE DATABASE "{self.name}"')
            self._admin(f'CREATE ROLE "{self.role}" LOGIN')
            owner = RoleStore("postgresql", self.folder, url=f"postgresql://postgres@127.0.0.1:5432/{self.name}",
                              policy=self.policy)
            owner.agent({"op": "verify"})  # migrated by its owner
            with psycopg.connect(owner.url, autocommit=True) as conn:
                conn.execute(f'GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO "{self.role}"')
                conn.execute(f'GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO "{self.role}"')
            made = RoleStore("postgresql", self.folder, url=f"postgresql://{self.role}@127.0.0.1:5432/{self.name}",
                             policy=self.policy)
        (self.folder / "role_agent.py").write_text(GIVE_BACK_AGENT)
        return made

    def __exit__(self, *exc) -> bool:
        if self.vendor == "postgresql":
            self._admin(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
            self._admin(f'DROP ROLE IF EXISTS "{self.role}"')
        return False


# --------------------------------------------------------------------------- cli25: the console script in a folder


def cli25_env(**extra: str) -> dict[str, str]:
    """The environment of a plain script's folder: no project, no store variables (``extra`` added)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("CTRLRUN_") and k not in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL", "SECRET_KEY")}
    env["PYTHONPATH"] = str(REPO)
    env.update(extra)
    return env


def cli25_run(folder: Path, *args: str, env: dict[str, str] | None = None, **options) -> subprocess.CompletedProcess:
    """``ctrlrun ARGS...`` as an OS process in ``folder`` (stdin not a terminal unless given)."""
    options.setdefault("stdin", subprocess.DEVNULL)
    return subprocess.run([sys.executable, "-m", "ctrlrun", *args], cwd=folder, env=env or cli25_env(),
                          capture_output=True, text=True, timeout=120, **options)


#: A script whose email.send times out: its key email:m1 is left AMBIGUOUS in the folder's store.
CLI25_AMBIGUOUS_SCRIPT = (
    "import ctrlrun\n"
    "@ctrlrun.protect('email.send', effect='email:{msg_id}')\n"
    "def send(msg_id: str) -> None:\n"
    "    raise TimeoutError('smtp timed out')\n"
    "with ctrlrun.context(agent='mailer'):\n"
    "    try:\n"
    "        send(msg_id='m1')\n"
    "    except TimeoutError:\n"
    "        pass\n")

CLI25_POLICY = """\
schema: ctrlrun.policy/v2
actions:
  email.send:
    effect: "email:{msg_id}"
    decision: allow
"""


def cli25_ambiguous_folder(folder: Path) -> Path:
    """``folder`` with a policy and a store holding one AMBIGUOUS effect, email:m1."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "ctrlrun.yaml").write_text(CLI25_POLICY)
    made = subprocess.run([sys.executable, "-c", CLI25_AMBIGUOUS_SCRIPT], cwd=folder, env=cli25_env(),
                          capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    return folder


def cli25_manage(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python manage.py ARGS...`` as an OS process in the repository (the example project)."""
    return subprocess.run([sys.executable, "manage.py", *args], cwd=REPO, env=env or cli25_env(SECRET_KEY="cli25-key"),
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


def cli25_loop(folder: Path, *args: str, seconds: float = 3.0) -> tuple[str, str, int]:
    """``ctrlrun ARGS...`` (a loop) as an OS process for ``seconds``, then Ctrl-C (SIGINT): its stdout,
    stderr and exit status."""
    import signal
    import time

    proc = subprocess.Popen([sys.executable, "-m", "ctrlrun", *args], cwd=folder, env=cli25_env(),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(seconds)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    return out, err, proc.returncode


# =========================================================================== tests20: shared by several test modules
# (moved here from the test modules that defined them: no test module imports another)

POLICIES = REPO / "tests" / "policies"


def policy_text(name: str) -> str:
    """The text of ``tests/policies/<name>.yaml``, a policy several test modules share."""
    return (POLICIES / f"{name}.yaml").read_text(encoding="utf-8")


#: stripe.refund allowed to 50,000, approved to 1,000,000, denied above; email.send, audit.note, iam.grant_admin.
REFUND_POLICY = policy_text("refund")


def execute_sql(statement: str, params: tuple = ()) -> None:
    """One raw statement in its own transaction, as the application's role could send it."""
    from django.db import connection, transaction

    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(statement, params)


# --------------------------------------------------------------------------- delegation (policies/delegation.yaml)

#: A delegation of the delegation policy's 'support' grant to worker, narrower than its parent.
CHILD = """\
subject: {agent: worker}
actions: [stripe.refund]
resources: ["payment:*"]
constraints: {amount_lte: 1000}
expires_at: "2098-12-31T00:00:00Z"
"""
DELEGABLE_CHILD = CHILD + "delegable: true\n"
GRANDCHILD = CHILD.replace("worker", "helper")


# --------------------------------------------------------------------------- the console through Django's test client


#: An amount in the approve band of REFUND_POLICY (above 50000, at most 1000000).
APPROVED_AMOUNT = 60000


def ask(refund, payment_id: str = "txn_1", amount: int = APPROVED_AMOUNT, user: str | None = None) -> str:
    """An agent's call in the approve band: returns the id of the pending request it leaves."""
    with ctrlrun.context(agent="support-agent", user=user):
        with pytest.raises(ctrlrun.ApprovalRequired) as caught:
            refund(payment_id=payment_id, amount=amount)
    return caught.value.request_id


def pay(refund, payment_id: str, amount: int = 100) -> None:
    """An allowed call that commits and writes a receipt."""
    with ctrlrun.context(agent="support-agent"):
        refund(payment_id=payment_id, amount=amount)


def url(name: str, *args: str) -> str:
    from django.urls import reverse

    return reverse(f"admin:{name}", args=args)


def approval_url(approval_id: str, answer: str | None = None) -> str:
    """The approval's page (or its confirmation page), with the pk quoted as the admin's own links quote it."""
    from django.contrib.admin.utils import quote

    if answer:
        return url("ctrlrun_approval_decide", quote(approval_id), answer)
    return url("ctrlrun_approval_change", quote(approval_id))


def receipt_url(receipt_id: str) -> str:
    from django.contrib.admin.utils import quote

    return url("ctrlrun_receipt_change", quote(receipt_id))


def text(response) -> str:
    import html

    return html.unescape(response.content.decode())


def shown_messages(response) -> list[str]:
    return [str(m) for m in response.context["messages"]]


def has_id(response, element_id: str) -> bool:
    return f'id="{element_id}"' in response.content.decode()


def login_redirect(response, path: str) -> bool:
    """A redirect to the admin's login page that comes back to ``path``."""
    from urllib.parse import parse_qs, urlsplit

    from django.urls import reverse

    if response.status_code != 302:
        return False
    location = urlsplit(response["Location"])
    return location.path == reverse("admin:login") and parse_qs(location.query)["next"] == [path]


def status(approval_id: str) -> str:
    from ctrlrun.models import Approval

    return Approval.objects.get(pk=approval_id).status


# --------------------------------------------------------------------------- the grants page (policies/grants.yaml)


def grant_refund(payment_id: str, amount: int, executor=lambda: "done"):
    """stripe.refund through the default Control as support-bot (the grants policy's 'support' grant)."""
    from ctrlrun.control import default_control

    return default_control().call("stripe.refund", {"payment_id": payment_id, "amount": amount}, executor,
                                  principal="support-bot")


# --------------------------------------------------------------------------- controls (policies/controls.yaml)

#: The title of the controls policy's ``long-one`` (stripped: the policy's text holds it without the last space).
LONG_TITLE = "Render the primary account number unreadable anywhere it is stored " * 6
CONTROLS_POLICY = policy_text("controls")
OBSERVE_POLICY = CONTROLS_POLICY.replace('version: "2026-12-a"\n', 'version: "2026-12-a"\nmode: observe\n')
BANNER = "OBSERVE MODE — nothing is enforced: every call runs; receipts record what enforcement would have done"


@ctrlrun.protect("email.send", effect="email:{msg_id}")
def send_email(msg_id: str) -> str:
    return f"sent {msg_id}"


@ctrlrun.protect("audit.note")
def note(text: str) -> str:
    return text


# --------------------------------------------------------------------------- paused framework runs (resumption)

FRAMEWORKS = ["openai-agents", "langgraph", "pydantic-ai"]


def ledger(files) -> list[str]:
    """The lines the resumable agents' refund appended, once per run (``files``: the ``files`` fixture)."""
    path = files["RESUME_LEDGER"]
    return path.read_text().splitlines() if path.exists() else []


def seen(files) -> list[dict]:
    """What the resumable agents' model was told, one document per turn."""
    path = files["RESUME_SEEN"]
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def pause(framework: str, arguments: dict | None = None, thread: str = "t-1") -> str:
    """Run the framework's agent in THIS process until it pauses on the refund; store the paused run."""
    import asyncio

    from ctrlrun import store
    from tests import resumable_agents as app

    arguments = dict(arguments or app.REFUND_ARGUMENTS)
    if framework == "openai-agents":
        from agents import RunConfig, Runner

        from ctrlrun.adapters.openai_agents import pause as pause_run

        agent, tool, _ = app.openai_agent(arguments=arguments)
        result = asyncio.run(Runner.run(agent, "refund it", run_config=RunConfig(tracing_disabled=True)))
        paused = pause_run(result, tool, resume_with="openai-refunds")
    elif framework == "langgraph":
        from ctrlrun.adapters.langchain import pause as pause_run

        config = {"configurable": {"thread_id": thread}}
        result = app.langgraph_agent().invoke({"messages": [("user", "refund it")]}, config)
        paused = pause_run(result, config, resume_with="langgraph-refunds")
    else:
        from ctrlrun.adapters.pydantic_ai import pause as pause_run

        result = app.pydantic_agent(arguments).run_sync("refund it")
        paused = pause_run(result, resume_with="pydantic-refunds")
    assert paused.status == "pending" and paused.framework == framework
    approval = store.get_approval(paused.approval_id)
    assert approval.status == "pending" and approval.arguments == arguments
    return paused.approval_id


def resume_runs(tmp_path, *args: str) -> subprocess.CompletedProcess:
    """``ctrlrun resume_runs --once`` in another OS process, on the test store."""
    env = script_environment(tmp_path, REFUND_POLICY)
    env.update({k: v for k, v in os.environ.items() if k.startswith("RESUME_")})
    return subprocess.run([sys.executable, "-m", "ctrlrun", "resume_runs", "--once", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=180)


def paused_row(approval_id: str):
    """The ``PausedRun`` row of the run paused on ``approval_id``."""
    from ctrlrun.models import PausedRun

    return PausedRun.objects.get(approval_id=approval_id)


def each_dict(node):
    """Every dict inside a JSON document, depth first."""
    if isinstance(node, dict):
        yield node
        node = list(node.values())
    if isinstance(node, list):
        for value in node:
            yield from each_dict(value)


def tamper(state_json: str, call_id: str, arguments: dict) -> str:
    """An OpenAI Agents paused run's JSON with one tool call's arguments changed, consistently (the SDK's
    invocation fingerprint is an unkeyed hash: whoever can edit the state can recompute it)."""
    from agents._tool_invocation import tool_invocation_identity_and_scope

    state = json.loads(state_json)
    encoded = json.dumps(arguments, separators=(",", ":"))
    raw = {"type": "function_call", "call_id": call_id, "name": "refund", "arguments": encoded, "id": call_id}
    _, _, scope, fingerprint = tool_invocation_identity_and_scope(raw)
    for node in list(each_dict(state)):
        if node.get("call_id") == call_id and "arguments" in node:
            node["arguments"] = encoded
        record = node.get(call_id)
        if isinstance(record, dict) and "fingerprint" in record:
            assert record["approval_scope"] == scope
            record["fingerprint"] = fingerprint
    return json.dumps(state)


# --------------------------------------------------------------------------- the console in a browser (tests/e2e)


def tile(console, kind: str):
    """One of the overview's tiles on the index page, by what it links to."""
    from selenium.webdriver.common.by import By

    return console.driver.find_element(By.CSS_SELECTOR, f'#ctrlrun-overview a.tile[href*="{kind}"]')


def row_link(console, pk: str):
    """The link of a change list row, found by the object's (quoted) primary key."""
    from django.contrib.admin.utils import quote
    from selenium.webdriver.common.by import By

    return console.driver.find_element(By.CSS_SELECTOR, f'#result_list a[href*="/{quote(pk)}/change/"]')


def shown_json(console) -> dict:
    from selenium.webdriver.common.by import By

    return json.loads(console.driver.find_element(By.CSS_SELECTOR, "pre.ctrlrun-json").text)


def clean_env() -> dict[str, str]:
    """This process's environment without ctrlrun's or Django's settings: a console script started with
    it finds its configuration as a user's would (its folder, its own environment)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("CTRLRUN_") and k not in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL", "SECRET_KEY")}
    env["PYTHONPATH"] = str(REPO)
    return env


# --------------------------------------------------------------------------- the console's browser (tests/e2e)

#: The browser window the console's browser tests photograph at: a laptop's.
WIDTH, HEIGHT = 1280, 800


def screenshot_folder() -> Path:
    folder = Path(os.environ.get("CTRLRUN_TEST_OUTPUT") or REPO / "test-output") / "screenshots"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


class Console:
    """One browser on the live console: opens pages, clicks, and photographs every page it visits."""

    def __init__(self, driver, base_url: str, test_name: str) -> None:
        self.driver = driver
        self.base_url = base_url
        self.test_name = re.sub(r"[^\w.-]+", "_", test_name)
        self.folder = screenshot_folder()
        for old in self.folder.glob(f"{self.test_name}-*.png"):
            old.unlink()
        self.shots: list[Path] = []

    # -- navigation

    def open(self, path: str) -> None:
        self.driver.get(self.base_url + path)

    def click(self, element) -> None:
        """Click something that loads a new page, and wait until the new page is there."""
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support import expected_conditions
        from selenium.webdriver.support.ui import WebDriverWait

        page = self.driver.find_element(By.TAG_NAME, "html")
        element.click()
        WebDriverWait(self.driver, 20).until(expected_conditions.staleness_of(page))
        WebDriverWait(self.driver, 20).until(
            lambda d: d.execute_script("return document.readyState") == "complete")

    def login(self, username: str, password: str = PASSWORD) -> None:
        """Log in through the admin's login form, as a person would."""
        from selenium.webdriver.common.by import By

        self.open("/admin/login/?next=/admin/")
        self.shot("login")
        self.by_id("id_username").send_keys(username)
        self.by_id("id_password").send_keys(password)
        self.click(self.driver.find_element(By.CSS_SELECTOR, "#login-form input[type=submit]"))
        assert self.path() == "/admin/", self.path()
        welcome = self.driver.find_element(By.CSS_SELECTOR, "#user-tools strong").get_attribute("textContent")
        assert welcome == username  # the page shows it upper-cased by CSS

    # -- reading

    def path(self) -> str:
        return self.driver.current_url.removeprefix(self.base_url).split("?")[0]

    def by_id(self, element_id: str):
        from selenium.webdriver.common.by import By

        return self.driver.find_element(By.ID, element_id)

    def has(self, element_id: str) -> bool:
        from selenium.common.exceptions import NoSuchElementException
        from selenium.webdriver.common.by import By

        try:
            self.driver.find_element(By.ID, element_id)
        except NoSuchElementException:
            return False
        return True

    def link(self, text: str):
        from selenium.webdriver.common.by import By

        return self.driver.find_element(By.LINK_TEXT, text)

    def request_link(self, approval_id: str):
        """The inbox shows a request's id shortened, with the whole id as its title."""
        from selenium.webdriver.common.by import By

        return self.driver.find_element(By.CSS_SELECTOR, f'a > span[title="{approval_id}"]')

    def text(self) -> str:
        from selenium.webdriver.common.by import By

        return self.driver.find_element(By.TAG_NAME, "body").text

    def messages(self) -> list[str]:
        from selenium.webdriver.common.by import By

        return [li.text for li in self.driver.find_elements(By.CSS_SELECTOR, "ul.messagelist li")]

    # -- evidence for the reviewer

    #: The window's width and height for screenshots (a subclass may photograph narrower).
    width, height = WIDTH, HEIGHT

    def shot(self, page: str) -> Path:
        """Save the whole page (the window grows to its height) as <test>-<page>.png."""
        height = self.driver.execute_script(
            "return Math.max(document.body.scrollHeight, document.documentElement.scrollHeight)")
        self.driver.set_window_size(self.width, min(max(self.height, height + 140), 6000))
        path = self.folder / f"{self.test_name}-{page}.png"
        try:
            assert self.driver.save_screenshot(str(path)), f"no screenshot saved for {page}"
        finally:
            self.driver.set_window_size(self.width, self.height)
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 2_000, path
        self.shots.append(path)
        return path
