"""The floors measured inside a ``compare.py`` worker, in blocks alternating with the scenario's calls.

``compare.py`` runs ``floor.py`` in a process of its own, so a load burst on the machine (another
job's build, a checkpoint) can land on one side and not the other. Here the floor runs in the
measured process itself: the worker alternates a block of N scenario calls with a block of N floor
operations (``--floor-block``; the block that goes first alternates too), so both sides share
whatever the machine is doing at that moment. Two floors:

- **the in-process floor** (``RawFloor``): ``floor.py``'s own statements through the bare driver
  (``sqlite3`` in WAL mode with ``synchronous=NORMAL``, or ``psycopg`` in autocommit with an explicit
  ``BEGIN``), on a scratch database of its own (a SQLite file in the worker's folder, or a scratch
  PostgreSQL database the driver made). ``floor.py`` defines its operations as closures inside
  ``main()``, so they cannot be imported: ``allowed`` / ``refused`` below replicate them statement
  for statement (``floor.py``'s ``SCHEMA``, ``receipt``, ``events``, ``allowed``, ``refused``), and
  when the given ``--floor-script`` has a ``SCHEMA`` that differs from ``FLOOR_SCHEMA`` the result
  says so (``inproc_floor_note``). A refusal looks up a key the floor committed (as ``floor.py``'s
  refused round does). Measured in both workers, ours and the reference's. It pays the process's
  garbage collector like everything else there: with Django and ctrlrun loaded, ~1.3x the cost it
  has in a bare process (measured once; ``gc.disable()`` brought it back).

- **our own schema's floor** (``OwnFloor``, ours only): the SQL statements one of our calls sends
  (captured with Django's ``connection.execute_wrapper`` around one untimed call of the scenario's
  shape, with the connection's ``commit`` noted so the two transactions are kept apart), replayed
  through the bare driver on a copy of our store (SQLite: the worker's ``state.db`` copied with the
  driver's backup API, triggers and all; PostgreSQL: ``pg_dump`` of the worker's database into a
  scratch database). Each replay gets fresh values where the schema wants them unique: the effect
  key and every ctrlrun id (``act_…``, ``ctr_…``: 32 hex digits) are replaced, at the same length,
  by a counter; the chain positions (``seq`` of the event and receipt inserts) are moved by what the
  head update's ``RETURNING`` hands back on the copy. Values Python computed (hashes, HMACs, JSON
  documents, timestamps) are replayed as captured: nothing in the database checks them, and none
  of them is unique. So it is what our statements cost the database and the driver, with none of
  our Python around them (Django's cursor, the policy, the signing, the JSON).
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import sqlite3
import statistics
import subprocess
import time
import uuid
from typing import Any, Callable

#: floor.py's SCHEMA, as it was when this was written (compared with the given script's).
FLOOR_SCHEMA = [
    "CREATE TABLE fx (k TEXT PRIMARY KEY, state TEXT, attempt INT, holder TEXT, lease TEXT)",
    "CREATE TABLE ev (id {serial}, action TEXT, kind TEXT, data TEXT, ts TEXT)",
    "CREATE TABLE rc (seq INT PRIMARY KEY, id TEXT, body TEXT, hash TEXT, prev TEXT)",
    "CREATE TABLE head (one INT PRIMARY KEY, seq INT, hash TEXT)",
    "INSERT INTO head VALUES (1, 0, 'genesis')",
]


def script_schema(path: str | None) -> list[str] | None:
    """The ``SCHEMA`` the floor script defines (importing it runs only its imports), or None."""
    if not path or not os.path.exists(path):
        return None
    spec = importlib.util.spec_from_file_location("_floor_script", path)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception:
        return None
    schema = getattr(module, "SCHEMA", None)
    return list(schema) if isinstance(schema, (list, tuple)) else None


class RawFloor:
    """floor.py's durable writes, one operation at a time, on a scratch database of its own."""

    def __init__(self, url: str | None, folder: str) -> None:
        self.url = url
        if url:
            import psycopg

            self.conn: Any = psycopg.connect(url, autocommit=True)
            self.ph, serial, self.begin = "%s", "BIGSERIAL PRIMARY KEY", "BEGIN"
            self.conn.execute("DROP TABLE IF EXISTS fx, ev, rc, head")
        else:
            self.conn = sqlite3.connect(os.path.join(folder, "inproc-floor.db"), isolation_level=None)
            self.conn.execute("PRAGMA journal_mode=WAL")
            self.conn.execute("PRAGMA synchronous=NORMAL")
            self.ph, serial, self.begin = "?", "INTEGER PRIMARY KEY AUTOINCREMENT", "BEGIN IMMEDIATE"
        for stmt in FLOOR_SCHEMA:
            self.conn.execute(stmt.format(serial=serial))
        self.committed: list[str] = []
        self.count = 0

    def q(self, sql: str) -> str:
        return sql.replace("?", self.ph)

    # ------------------------------------------------------------ floor.py's statements, replicated
    def receipt(self, cur: Any, action: str, result: str) -> None:
        seq, prev = cur.execute("SELECT seq, hash FROM head WHERE one = 1").fetchone()
        body = json.dumps({"action_id": action, "result": result, "seq": seq + 1, "prev_hash": prev},
                          sort_keys=True, separators=(",", ":"))
        digest = "sha256:" + hashlib.sha256(body.encode()).hexdigest()
        cur.execute(self.q("INSERT INTO rc VALUES (?, ?, ?, ?, ?)"), (seq + 1, uuid.uuid4().hex, body, digest, prev))
        cur.execute(self.q("UPDATE head SET seq = ?, hash = ? WHERE one = 1"), (seq + 1, digest))

    def events(self, cur: Any, action: str, kinds: list[str]) -> None:
        values = ", ".join(["(?, ?, ?, ?)"] * len(kinds))
        params = [v for kind in kinds for v in (action, kind, "{}", "2026-12-01T00:00:00Z")]
        cur.execute(self.q(f"INSERT INTO ev (action, kind, data, ts) VALUES {values}"), params)

    def allowed(self, key: str) -> None:
        conn, action = self.conn, uuid.uuid4().hex
        conn.execute(self.begin)
        self.events(conn, action, ["ACTION_PROPOSED", "POLICY_EVALUATED", "EFFECT_RESERVED", "EXECUTION_STARTED"])
        conn.execute(self.q("INSERT INTO fx VALUES (?, 'executing', 1, ?, 'x')"), (key, action))
        conn.execute("COMMIT")
        conn.execute(self.begin)
        conn.execute(self.q("UPDATE fx SET state = 'committed' WHERE k = ? AND holder = ?"), (key, action))
        self.events(conn, action, ["EXECUTION_COMMITTED"])
        self.receipt(conn, action, "committed")
        conn.execute("COMMIT")

    def refused(self, key: str) -> None:
        conn, action = self.conn, uuid.uuid4().hex
        conn.execute(self.begin)
        conn.execute(self.q("SELECT state FROM fx WHERE k = ?"), (key,)).fetchone()
        self.events(conn, action, ["ACTION_PROPOSED", "POLICY_EVALUATED", "EFFECT_RESERVATION_REFUSED"])
        self.receipt(conn, action, "blocked")
        conn.execute("COMMIT")

    # ------------------------------------------------------------ blocks
    def prepare(self, kind: str, n: int) -> None:
        """Untimed: warm the connection; a refusal floor gets committed keys to look up."""
        for i in range(n):
            key = f"refund:warm_{i}"
            self.allowed(key)
            self.committed.append(key)

    def block(self, kind: str, n: int) -> float:
        start = time.perf_counter()
        if kind == "floor_allowed":
            for _ in range(n):
                self.count += 1
                self.allowed(f"refund:inproc_{self.count}")
        else:
            keys = self.committed
            for _ in range(n):
                self.count += 1
                self.refused(keys[self.count % len(keys)])
        return time.perf_counter() - start

    def close(self) -> None:
        if self.url:
            self.conn.execute("DROP TABLE IF EXISTS fx, ev, rc, head")
        self.conn.close()


# =========================================================================== our own schema's floor

#: A ctrlrun id (``act_``, ``ctr_``, ``apr_`` ...: three letters, an underscore, 32 hex digits).
ID_PATTERN = re.compile(r"\b[a-z]{3}_[0-9a-f]{32}\b")
INSERT_COLUMNS = re.compile(r'INSERT INTO "(\w+)" \(([^)]*)\) VALUES', re.IGNORECASE)
VALUES_ROW = re.compile(r"\s*,?\s*\(([^()]*)\)")


def seq_slots(sql: str) -> list[tuple[int, str]]:
    """(parameter position, table) of every ``seq`` value the statement inserts: its inserts may be
    several (PostgreSQL writes the events, the receipts and the head's move as one statement, the
    inserts as data-modifying CTEs), each with rows of ``%s`` and literals."""
    slots = []
    for match in INSERT_COLUMNS.finditer(sql):
        columns = [c.strip().strip('"') for c in match.group(2).split(",")]
        if "seq" not in columns:
            continue
        at, base, pos = columns.index("seq"), sql.count("%s", 0, match.end()), match.end()
        while (row := VALUES_ROW.match(sql, pos)) is not None:
            items = [item.strip() for item in row.group(1).split(",")]
            if len(items) == len(columns) and items[at] == "%s":
                slots.append((base + items[:at].count("%s"), match.group(1)))
            base, pos = base + items.count("%s"), row.end()
    return slots
COMMIT, ROLLBACK = "<commit>", "<rollback>"


def capture(call: Callable[[], Any]) -> list[tuple[str, Any]]:
    """The statements ``call()`` sends on this thread's default connection, in order, with a
    ``COMMIT`` marker where the connection committed (Django commits through the driver, not a
    statement); its result is ignored (a refusal is a result here)."""
    from django.db import connection

    steps: list[tuple[str, Any]] = []

    def watch(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if many:
            raise RuntimeError("own floor: an executemany() cannot be replayed")
        steps.append((sql, None if params is None else list(params)))
        return execute(sql, params, many, context)

    commit, rollback = connection.commit, connection.rollback

    def noted_commit() -> None:
        steps.append((COMMIT, None))
        commit()

    def noted_rollback() -> None:
        steps.append((ROLLBACK, None))
        rollback()

    connection.commit, connection.rollback = noted_commit, noted_rollback  # this connection, this call only
    try:
        with connection.execute_wrapper(watch):
            try:
                call()
            except Exception as exc:
                from ctrlrun import CTRLRunError

                if not isinstance(exc, CTRLRunError):
                    raise
    finally:
        del connection.commit, connection.rollback  # back to the class's methods
    if any(sql == ROLLBACK for sql, _ in steps):
        raise RuntimeError("own floor: the captured call rolled back; nothing sensible to replay")
    return steps


class _Step:
    """One captured statement, its unique values located once."""

    def __init__(self, sql: str, params: list[Any] | None, sqlite: bool, tokens: list[str], head_take: bool) -> None:
        self.marker = sql if sql in (COMMIT, ROLLBACK) else None
        self.params, original = params, sql
        if params is not None and sqlite:
            sql = sql.replace("%s", "?").replace("%%", "%")
        self.sql = sql
        self.head_take = head_take
        # (position, captured text) of every parameter holding a value that must be fresh
        self.text_slots = [(i, p) for i, p in enumerate(params or []) if isinstance(p, str)
                           and any(t in p for t in tokens)]
        self.seq_slots = seq_slots(original) if params else []  # (position, table) of chain positions
        # A budget ledger row continues its (grant, metric) chain (n one past the last, cum the last
        # plus the amount; the database refuses anything else): the replay reads the chains' last rows
        # as the store does and continues them from what it read, not from the captured positions.
        from ctrlrun.store import sql as ours  # the store's own statements name what to look for

        self.ledger_read = ours.LEDGER_LAST in original
        self.ledger_insert = original.startswith(ours.LEDGER_INSERT)


def continue_ledger(params: list[Any], lasts: dict[int, tuple[Any, ...]]) -> list[Any]:
    """A captured ledger insert (rows of grant, metric, amount, effect key, attempt, consumed_at,
    released_at, n, cum, mac) renumbered to continue the chains' last rows ``(n, cum, ...)`` by row."""
    params = list(params)
    for row in range(len(params) // 10):
        last, amount = lasts.get(row), params[row * 10 + 2]
        params[row * 10 + 7] = 1 if last is None else last[0] + 1
        params[row * 10 + 8] = amount if last is None else last[1] + amount
    return params


class OwnFloor:
    """Our captured statements, replayed through the bare driver on a copy of our store."""

    def __init__(self, steps: list[tuple[str, Any]], effect_key: str, *, sqlite_path: str | None = None,
                 pg_source: str | None = None, pg_url: str | None = None, folder: str = ".") -> None:
        from ctrlrun.store import sql as ours

        tokens = {effect_key} | {m for _, params in steps for p in (params or []) if isinstance(p, str)
                                 for m in ID_PATTERN.findall(p)}
        self.tokens = sorted(tokens, key=len, reverse=True)  # the longest first: no token inside another
        self.sqlite = sqlite_path is not None
        self.steps = [_Step(sql, params, self.sqlite, self.tokens, sql.startswith(ours.HEAD_TAKE))
                      for sql, params in steps]
        # The chain positions the capture wrote, per table: the head's new position was the last of them.
        self.captured_top: dict[str, int] = {}
        for step in self.steps:
            for i, table in step.seq_slots:
                self.captured_top[table] = max(self.captured_top.get(table, 0), step.params[i])
        self.statements = sum(1 for s in self.steps if s.marker is None)
        self.commits = sum(1 for s in self.steps if s.marker == COMMIT)
        self.count = 0
        if self.sqlite:
            path = os.path.join(folder, "own-floor.db")
            source = sqlite3.connect(sqlite_path)
            target = sqlite3.connect(path)
            source.backup(target)
            source.close()
            target.close()
            self.conn: Any = sqlite3.connect(path, isolation_level=None)
            for pragma in ("journal_mode=WAL", "synchronous=NORMAL", "foreign_keys=ON"):  # as Django's store opens it
                self.conn.execute(f"PRAGMA {pragma}")
        else:
            import psycopg

            if not shutil.which("pg_dump") or not shutil.which("psql"):
                raise RuntimeError("own floor on PostgreSQL needs pg_dump and psql on PATH")
            dump = subprocess.run(["pg_dump", "--no-owner", "--no-privileges", pg_source], capture_output=True,
                                  text=True, check=True).stdout
            subprocess.run(["psql", "-q", "-v", "ON_ERROR_STOP=1", pg_url], input=dump, capture_output=True,
                           text=True, check=True)
            # Django's PostgreSQL connections bind parameters client-side; so does this one.
            self.conn = psycopg.connect(pg_url, autocommit=False, cursor_factory=psycopg.ClientCursor)
        self.head_columns = {"ctrlrun_receipt": 0, "ctrlrun_event": 2}  # HEAD_TAKE's RETURNING seq, event_seq

    def fresh(self) -> list[tuple[_Step, list[Any] | None]]:
        """One replay's parameters (untimed): every token replaced, at its length, by a counter."""
        self.count += 1
        swap = {}
        for token in self.tokens:
            tail = f"{self.count:x}"
            if ID_PATTERN.fullmatch(token):
                swap[token] = token[:4] + f"{os.getpid():08x}" + tail.rjust(24, "0")
            else:
                swap[token] = f"{token.rsplit(':', 1)[0]}:own_{self.count}"
        out = []
        for step in self.steps:
            params = step.params
            if step.text_slots:
                params = list(params)
                for i, text in step.text_slots:
                    for token in self.tokens:
                        text = text.replace(token, swap[token])
                    params[i] = text
            out.append((step, params))
        return out

    def replay(self, plan: list[tuple[_Step, list[Any] | None]]) -> None:
        conn, offsets, lasts = self.conn, {}, {}
        for step, params in plan:
            if step.marker is not None:
                conn.commit() if not self.sqlite else conn.execute("COMMIT")
                continue
            if step.seq_slots and offsets:
                params = list(params)
                for i, table in step.seq_slots:
                    params[i] += offsets.get(table, 0)
            if step.ledger_insert:
                params = continue_ledger(params, lasts)
            cur = conn.execute(step.sql) if params is None else conn.execute(step.sql, params)
            rows = cur.fetchall() if cur.description is not None else None  # read, as the store reads them
            if step.ledger_read:
                lasts = {int(row[0]): row[1:] for row in rows}
            if step.head_take:
                row = rows[0]
                offsets = {table: row[col] - self.captured_top.get(table, 0)
                           for table, col in self.head_columns.items()}

    def block(self, n: int) -> float:
        plans = [self.fresh() for _ in range(n)]  # untimed
        start = time.perf_counter()
        for plan in plans:
            self.replay(plan)
        return time.perf_counter() - start

    def close(self) -> None:
        self.conn.close()


# =========================================================================== the session's side


class Floors:
    """What a worker's session calls between its blocks: ``block(n)`` runs n operations of each
    floor (timed, each its own clock), ``end_round(calls)`` closes a round's per-call figures."""

    def __init__(self, kind: str, raw: RawFloor | None, own: OwnFloor | None, note: str | None = None,
                 errors: list[str] | None = None) -> None:
        self.kind, self.raw, self.own, self.note, self.errors = kind, raw, own, note, errors or []
        self.totals = {"inproc": 0.0, "own": 0.0}
        self.rounds: dict[str, list[float]] = {"inproc": [], "own": []}

    def warm(self, n: int) -> None:
        """Untimed: the refusal floor's committed keys, then one block of each floor."""
        if self.raw is not None:
            try:
                self.raw.prepare(self.kind, n)
            except Exception as exc:
                self.errors.append(f"in-process floor: {type(exc).__name__}: {exc}"[:300])
                self.raw = None
        self.block(n)
        self.totals = dict.fromkeys(self.totals, 0.0)

    def block(self, n: int) -> None:
        """n operations of each floor; a floor that fails is reported and dropped, the scenario goes on."""
        if self.raw is not None:
            try:
                self.totals["inproc"] += self.raw.block(self.kind, n)
            except Exception as exc:
                self.errors.append(f"in-process floor: {type(exc).__name__}: {exc}"[:300])
                self.raw = None
        if self.own is not None:
            try:
                self.totals["own"] += self.own.block(n)
            except Exception as exc:
                self.errors.append(f"own floor: {type(exc).__name__}: {exc}"[:300])
                self.own = None

    def end_round(self, calls: int) -> None:
        for name in self.totals:
            self.rounds[name].append(self.totals[name] / calls * 1e6)
            self.totals[name] = 0.0

    def results(self) -> dict[str, Any]:
        out: dict[str, Any] = {"inproc_floor_kind": self.kind}
        if self.note:
            out["inproc_floor_note"] = self.note
        if self.raw is not None and self.rounds["inproc"]:
            out["inproc_floor_per_round_us"] = self.rounds["inproc"]
            out["inproc_floor_us"] = statistics.median(self.rounds["inproc"])
        if self.own is not None and self.rounds["own"]:
            out["own_floor_per_round_us"] = self.rounds["own"]
            out["own_floor_us"] = statistics.median(self.rounds["own"])
            out["own_floor_statements"] = self.own.statements
            out["own_floor_commits"] = self.own.commits
        return out

    def close(self) -> None:
        for floor in (self.raw, self.own):
            if floor is not None:
                floor.close()


def _capture_call(ctrlrun: Any, scenario: str, protect_options: dict[str, Any], allowed: int,
                  denied: int) -> tuple[Callable[[], Any], str]:
    """One call of the scenario's shape, on a sync twin of the protected function (the SQL is the
    same for both drivers; Django refuses a sync call inside the event loop), for the own floor to
    capture: ``(call, its effect key)``. Its store is configured and warmed first, untimed."""
    twin = ctrlrun.protect("stripe.refund", effect="refund:{payment_id}", **protect_options)(
        lambda payment_id, amount: {"id": f"re_{payment_id}", "amount": amount})
    base = scenario.split("_async")[0]
    for n in range(3):
        twin(payment_id=f"capture_warm{n}", amount=allowed)
    if base == "duplicate":
        twin(payment_id="capture", amount=allowed)  # committed: the captured call is refused as a duplicate
    amount = denied if base == "denied" else allowed
    return (lambda: twin(payment_id="capture", amount=amount)), "refund:capture"


def for_worker(ctrlrun: Any, scenario: str, kind: str, *, ours: bool, protect_options: dict[str, Any],
               allowed: int, denied: int, floor_script: str | None, floor_url: str | None,
               own_floor_url: str | None) -> Floors:
    """A ``compare.py`` worker's floors, set up before its session (untimed): the in-process floor on
    ``floor_url`` (else a SQLite file in the worker's folder), and for ours (not for an approval,
    whose rows are single-use) the own floor, captured from one call of the scenario's shape. A floor
    that cannot be set up is reported in the result (``inproc_floor_error``), not fatal."""
    note = None
    given = script_schema(floor_script)
    if given is not None and given != FLOOR_SCHEMA:
        note = f"{floor_script}'s SCHEMA differs from the replica in bench/inprocess_floor.py"
    raw = own = None
    errors: list[str] = []
    try:
        raw = RawFloor(floor_url, os.getcwd())
    except Exception as exc:
        errors.append(f"in-process floor: {type(exc).__name__}: {exc}"[:300])
    if ours and not scenario.startswith("approval"):
        try:
            with ctrlrun.context(agent="bench-agent"):
                call, key = _capture_call(ctrlrun, scenario, protect_options, allowed, denied)
                steps = capture(call)
            from django.db import connection

            if connection.vendor == "sqlite":
                own = OwnFloor(steps, key, sqlite_path=connection.settings_dict["NAME"])
            elif own_floor_url:
                own = OwnFloor(steps, key, pg_source=os.environ["CTRLRUN_STORE_URL"], pg_url=own_floor_url)
        except Exception as exc:
            errors.append(f"own floor: {type(exc).__name__}: {exc}"[:300])
    return Floors(kind, raw, own, note, errors)


def blocks(calls: int, size: int) -> list[int]:
    """``calls`` split into blocks of ``size`` (the last one shorter); one block when size is 0."""
    if size <= 0 or size >= calls:
        return [calls]
    return [size] * (calls // size) + ([calls % size] if calls % size else [])
