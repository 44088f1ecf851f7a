"""Scratch stores for ``verify`` and clock skew: a fresh PostgreSQL database (named after this run's test
database, so concurrent runs never meet) migrated by its owner, reached as the owner or as an application
role with SELECT/INSERT/UPDATE/DELETE only; or a SQLite file. And an agent under a clock that can move."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

from .machine import POSTGRES_ADMIN_URL, require_faketime, require_postgresql
from .roles import RoleStore

__all__ = ["NOTE_POLICY", "SKEW_AGENT", "scratch_store", "skewed_agent", "copy_row"]

#: One allowed, unkeyed action: every call is one reservation-free phase pair on the store.
NOTE_POLICY = """\
schema: ctrlrun.policy/v1
actions:
  note.write:
    decision: allow
"""

#: ``skew_agent.py CLOCK_FILE INTERVAL OPS_JSON``: each op is ``"call"`` (one protected call) or a
#: faketime offset (``"+30s"``, ``"+0"``) written to the clock file this process's libfaketime reads.
SKEW_AGENT = r'''
import json, sys, time
import ctrlrun

@ctrlrun.protect("note.write")
def note(text: str) -> str:
    return text

ctrlrun.setup()
from django.conf import settings
settings.CTRLRUN_CLOCK_SKEW_INTERVAL_SECONDS = float(sys.argv[2])
out = []
for op in json.loads(sys.argv[3]):
    if op == "call":
        with ctrlrun.context(agent="note-agent"):
            out.append(note(text="hello"))
        due = time.monotonic() + float(sys.argv[2]) * 2  # the next call finds a measurement due (no
        while time.monotonic() < due:                    # sleep: faketime's sleep refuses a real monotonic)
            pass
    else:
        with open(sys.argv[1], "w") as clock:
            clock.write(op + "\n")
print(json.dumps(out))
'''


def _admin(statement: str) -> None:
    import psycopg

    with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as admin:
        admin.execute(statement)


class scratch_store:
    """A scratch store under ``policy``: on PostgreSQL a new database ``<test database>_<tag>_<hex>``
    migrated by its owner, reached as an application role (``as_role=True``: the RoleStore's grants) or
    as the owner; on SQLite a new file. Dropped afterwards."""

    def __init__(self, vendor: str, folder: Path, policy: str = NOTE_POLICY, *, tag: str = "scratch",
                 as_role: bool = True) -> None:
        from django.db import connection

        self.vendor, self.folder, self.policy, self.as_role = vendor, folder, policy, as_role
        suffix = uuid.uuid4().hex[:8]
        base = re.sub(r"[^a-z0-9_]", "_", str(connection.settings_dict["NAME"]).rsplit("/", 1)[-1].lower())[:30]
        self.name, self.role = f"{base}_{tag}_{suffix}".lower(), f"{base}_{tag}_app_{suffix}".lower()

    def __enter__(self) -> RoleStore:
        if self.vendor == "sqlite":
            made = RoleStore("sqlite", self.folder, path=self.folder / "store.db", policy=self.policy)
            self._migrate(made)
            return made
        import psycopg

        require_postgresql()
        _admin(f'CREATE DATABASE "{self.name}"')
        owner = RoleStore("postgresql", self.folder, url=f"postgresql://postgres@127.0.0.1:5432/{self.name}",
                          policy=self.policy)
        self._migrate(owner)
        if not self.as_role:
            return owner
        _admin(f'CREATE ROLE "{self.role}" LOGIN')
        with psycopg.connect(owner.url, autocommit=True) as conn:
            conn.execute(f'GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO "{self.role}"')
            conn.execute(f'GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO "{self.role}"')
        return RoleStore("postgresql", self.folder, url=f"postgresql://{self.role}@127.0.0.1:5432/{self.name}",
                         policy=self.policy)

    def _migrate(self, store: RoleStore) -> None:
        done = subprocess.run([sys.executable, "-c", "import ctrlrun; ctrlrun.setup()"], cwd=self.folder,
                              env=store.environment(), capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr

    def __exit__(self, *exc) -> bool:
        if self.vendor == "postgresql":
            _admin(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
            _admin(f'DROP ROLE IF EXISTS "{self.role}"')
        return False


def skewed_agent(store: RoleStore, clock: str, operations: list[str], *, interval: float = 0.01) -> list:
    """Run ``SKEW_AGENT`` under faketime, starting ``clock`` off (``"+30s"``); ops may move the clock.

    ``faketime -f`` starts the process with libfaketime preloaded; its ``FAKETIME`` is then unset so the
    library reads the offset from a file instead, re-read at every clock reading. The monotonic clock
    is left alone (the interval between measurements is measured on it)."""
    faketime = require_faketime()
    clock_file = store.folder / "clock.txt"
    clock_file.write_text(clock + "\n")
    (store.folder / "skew_agent.py").write_text(SKEW_AGENT)
    env = store.environment()
    env.update(FAKETIME_TIMESTAMP_FILE=str(clock_file), FAKETIME_NO_CACHE="1", FAKETIME_DONT_FAKE_MONOTONIC="1")
    command = [faketime, "-f", clock, shutil.which("env") or "/usr/bin/env", "-u", "FAKETIME", sys.executable,
               str(store.folder / "skew_agent.py"), str(clock_file), str(interval), json.dumps(operations)]
    done = subprocess.run(command, cwd=store.folder, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def copy_row(store: RoleStore, table: str, where: str, **changes: object) -> None:
    """As the application role: INSERT a copy of one row of ``table`` with ``changes`` (a serial id
    left to the database)."""
    if store.vendor == "sqlite":
        columns = [c for (c,) in store.sql(f"SELECT name FROM pragma_table_info('{table}')")]
    else:
        columns = [c for (c,) in store.sql("SELECT column_name FROM information_schema.columns WHERE table_name = %s "
                                           "ORDER BY ordinal_position", table)]
    columns = [c for c in columns if not (c == "id" and "id" not in changes)]
    picked = ", ".join("%s" if c in changes else f'"{c}"' for c in columns)
    names = ", ".join(f'"{c}"' for c in columns)
    store.sql(f'INSERT INTO "{table}" ({names}) SELECT {picked} FROM "{table}" WHERE {where} LIMIT 1',
              *[changes[c] for c in columns if c in changes])
