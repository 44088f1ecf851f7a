"""The application's database role: a real PostgreSQL role with exactly its grants, a SQLite
file written around ctrlrun, and the agent script the role matrix drives."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path



from .base import REPO, evidence_unguarded



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
    if kind == "mail":  # two deliveries about a request (one sent, its link used), as ctrlrun.notify records them
        from ctrlrun.store.people import Person
        rows = store.notifications.plan_deliveries(op["approval"], [(Person("ana", "ana@example.test"), "setting", None),
                                                                    (Person("bea", ""), "setting", "no address")])
        claimed, _ = store.notifications.begin_attempt(rows[0].id, __import__("datetime").timedelta(minutes=1))
        store.notifications.finish_attempt(claimed.id, claimed.attempts, "sent", None, None)
        return {"value": store.notifications.use_link(rows[0].link_nonce, op["approval"], "ana")[0]}
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
    if kind in ("suspend", "resume_call"):  # a suspended refund (spec A5), and its resume by token
        from ctrlrun.control import default_control
        control = default_control()
        if kind == "resume_call":
            return {"value": control.resume(op["token"], lambda: "refunded")}
        def suspend():
            raise ctrlrun.Suspended(op["token"])
        try:
            control.call("stripe.refund", {"payment_id": op["payment_id"], "amount": op["amount"]}, suspend,
                         principal="support-agent")
        except ctrlrun.Suspended as suspended:
            return {"value": suspended.round}
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
