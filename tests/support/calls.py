"""Calls held open in another OS process, and the stores the approval give-back attacks run on."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path



from .base import script_environment
from .machine import POSTGRES_ADMIN_URL, require_postgresql
from .roles import ROLE_AGENT, ROLE_POLICY, RoleStore



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
GIVE_BACK_POLICY = "schema: ctrlrun.policy/v2\n" + ROLE_POLICY[ROLE_POLICY.index("\nactions:") + 1:]  # the same actions

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
