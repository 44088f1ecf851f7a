#!/usr/bin/env python3
"""This project's ctrlrun beside the reference (PyPI ``ctrlrun==0.12.2``) and beside the floor, one run.

    python bench/compare.py                                   # both databases, every scenario
    python bench/compare.py --db sqlite --calls 100 --rounds 3
    python bench/compare.py --db sqlite --scenarios allowed,allowed_async
    python bench/compare.py --reference-python /path/to/venv/bin/python --floor-script /path/to/floor.py

The driver runs every measurement twice, in separate processes: once with this interpreter and
``PYTHONPATH`` set to the repository root (so this checkout's ``ctrlrun`` is imported), once with
``--reference-python`` (a virtualenv holding the reference package). Each run is this same file
in worker mode, ``compare.py --worker SCENARIO --dir DIR ...``, which imports whichever
``ctrlrun`` its interpreter has, tells which one it is (ours has ``ctrlrun.standalone``; both have
``ctrlrun.Control``) and prints one JSON line. Every worker gets a fresh empty folder holding only
``ctrlrun.yaml`` (the embedded SQLite store lands in its ``.ctrlrun/``), and on PostgreSQL a fresh
database, dropped afterwards.

The floor (``--floor-script``, default ``../shared/bench/floor.py`` beside the repository) does an
allowed call's durable writes through the raw driver and nothing else (``floor_allowed``: two
commits; ``floor_refused``: one). It runs on each database measured, with the same ``--calls`` and
``--rounds``, in a scratch folder (its SQLite file) or a scratch PostgreSQL database of its own,
in every pass. Each per-call row reads ours and the reference against it (``ours/floor``,
``ref/floor``): allowed and approval against ``floor_allowed``, duplicate and denied against
``floor_refused``.

The in-process floors (``bench/inprocess_floor.py``, whose docstring has the details) answer the
separate process's weakness: a load burst on a shared machine lands on one side and not the other.
Inside each worker, ours and the reference's, a round's ``--calls`` are made in blocks of
``--floor-block`` (default 25; 0 turns this off) alternating with blocks of as many floor operations
(which goes first alternates by block and by round), each side timed on its own clock, so the
scenario and its floors share whatever the machine is doing (so ``ours µs`` and ``reference µs`` are
then made of those blocks too; with ``--floor-block 0`` a round is one run of its calls, as before):

- ``floor(in-process)``: ``floor.py``'s statements (its functions are closures inside its ``main()``,
  so they are replicated statement for statement, and a ``--floor-script`` whose ``SCHEMA`` differs
  from the replica is named under the table) through the bare driver on a scratch database of the
  worker's own (a SQLite file in its folder; on PostgreSQL a scratch database the driver made),
  ``floor_allowed``'s two commits or ``floor_refused``'s one as above. The cell shows the floor
  measured in ours' worker / in the reference's; ``ours/floor(in-process)`` and
  ``ref/floor(in-process)`` each divide by the floor of their own process.
- ``own-floor`` (ours only; not for ``approval``, whose rows are single-use): the SQL statements one
  of our calls of the scenario's shape sends, captured with Django's ``execute_wrapper`` (and the
  connection's commits) around one untimed call of a sync twin of the protected function, replayed
  through the bare driver (``sqlite3``, or ``psycopg`` with client-side binding as Django's) on a
  copy of our store (SQLite's backup API; ``pg_dump`` into a scratch database on PostgreSQL).
  Each replay gets a fresh effect key and fresh ctrlrun ids (a counter, at the ids' length), and
  its chain positions (``seq``) follow what the head update returns on the copy; the values Python
  computed (hashes, HMACs, receipt documents, timestamps) are replayed as captured, since nothing
  in the database checks them or wants them unique. ``ours/own-floor`` is then what our Python
  (Django, the policy, the signing, the JSON) adds to our own statements; ``own-floor /
  floor(in-process)`` what our schema (indexes, triggers, wider rows) costs over ``floor.py``'s.

Speed figures are measured here, never asserted in tests: ``tests/integration/test_bench_compare_floor.py``
only checks that a worker prints the floors' keys (``inproc_floor_us``, ``own_floor_us`` ...).

Scenarios (per-call cost: mean µs per call in each round, median over ``--rounds``):

- ``allowed``    an allowed call with a fresh effect key (reserve, run, record);
- ``allowed_budget`` the same call by an agent holding a grant (policy v7 ``authority:``) with two
                 budgets, each charged to the ledger in the reservation's transaction;
- ``duplicate``  a call whose key is already committed, refused (``DuplicateEffect``); the keys are
                 committed untimed first;
- ``denied``     a call the policy denies (``ActionDenied``);
- ``approval``   an approval presented: request (``ApprovalRequired``) and grant are untimed, only
                 the call inside ``with_approval(request_id)`` is timed;
- ``allowed_async``, ``duplicate_async``, ``denied_async``, ``approval_async``
                 the same, with the protected function an ``async def``: the worker awaits the
                 calls one after another inside one ``asyncio.run()``, so the cost includes the
                 async driver's hops to its store threads (the grant runs in a thread, untimed).
                 The reference refuses ``async def`` (at decoration): "n/a (refuses async def)";
- ``allowed_async_concurrent``
                 ``--calls`` allowed calls on distinct keys at once (``asyncio.gather``), per
                 round; µs per call is the round's wall time / calls. Ours only;
- ``contention`` ``--workers`` OS processes race over the same ``--keys`` keys (half walk them
                 forwards, half backwards); throughput is attempts/s from the common start to the
                 last worker's end, median over ``--races`` races (fresh keys each, same processes
                 and store), and every key must have executed exactly once (an append-only log
                 under ``flock``).

A scenario is written once, as a generator that yields the calls it wants made (``_Session``);
a sync driver and an async driver make them, so both paths measure the same steps.

The reference on PostgreSQL: its ``protect()`` ignores ``CTRLRUN_STORE_URL`` / ``DATABASE_URL``
and always uses SQLite, so its PostgreSQL runs go through the measurement shim in
``--reference-pg-shim`` (default ``bench/reference_pg``: a ``sitecustomize.py`` that, with ``REFPG_URL``
set, builds the reference's default ``Control`` on its own public ``PostgresStateStore``).
Approvals are granted through each implementation's own surface: ours with
``ctrlrun.store.answer_approval`` (what ``ctrlrun approve ID --by NAME`` calls), the reference's
with its ``ctrlrun approve ID`` command, invoked in-process (click), against the same store.

On a busy machine use ``--passes 3``: every measurement (the floors too) is repeated, alternating
which side runs first (the floor: before the others in one pass, after them in the next), and the
median is reported, with each pass's value listed under the table.

The output is Markdown, to paste into an issue note: one row per (scenario, db), columns
scenario | db | ours µs | reference µs | ours/ref | floor µs | ours/floor | ref/floor |
floor(in-process) µs ours / ref | ours/floor(in-process) | ref/floor(in-process) | own-floor µs |
ours/own-floor | target (the targets still read the separate floor);
contention in a table of its own; then the machine line (Python, SQLite and PostgreSQL versions,
CPU count) and how each number was made.

Targets (from the issue) are printed as met / not met; they never change the exit status: against
the reference (``TARGETS``), and an allowed call, sync and async, <= 3x the floor on SQLite and
<= 1.5x on PostgreSQL (``FLOOR_TARGETS``). The exit status is non-zero only when a measurement
could not be made (ours, the reference when it is installed, the floor when its script exists, an
in-process floor that could not be set up or failed: named under the table as ``error: in-process floor``) or
a correctness check failed (a duplicate ran, a denied call ran, a key executed twice under
contention).
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import fcntl
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any, Generator, Iterator, NamedTuple
from urllib.parse import urlsplit, urlunsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run by either interpreter: its sibling module
import inprocess_floor  # noqa: E402

HERE = Path(__file__).resolve()
REPO = HERE.parent.parent
RESULT_MARK = "@@compare-result "

POLICY = """\
schema: ctrlrun.policy/v2

actions:
  stripe.refund:
    effect: "refund:{payment_id}"
    rules:
      - when: { amount_gte: 0, amount_lte: 50000 }
        decision: allow
      - when: { amount_gte: 0, amount_lte: 1000000 }
        decision: approve
      - decision: deny
  ledger.post:
    effect: "post:{entry_id}"
    decision: allow
"""

#: ``allowed_budget``: the same allowed refund, by an agent holding a grant (policy v7 ``authority:``)
#: whose budgets (a count and a sum of amounts per day, far from their limits) every call is charged.
BUDGET_POLICY = POLICY.replace("schema: ctrlrun.policy/v2\n", """schema: ctrlrun.policy/v7
authority:
  grants:
    - id: bench
      subject: {agent: bench-agent}
      actions: ["stripe.*", "ledger.*"]
      budgets:
        - {metric: count, limit: 1000000000, window: P1D}
        - {metric: amount, limit: 1000000000000, window: P1D}
""")

ALLOWED, APPROVED, DENIED_AMOUNT = 100, 500_000, 10**9
SYNC_SCENARIOS = ("allowed", "duplicate", "denied", "approval", "allowed_budget")
# The same calls to an `async def`, awaited one after another in one asyncio.run(); and allowed calls made
# all at once (asyncio.gather). The reference refuses `async def`: its cell reads "n/a".
ASYNC_SCENARIOS = (*(f"{s}_async" for s in SYNC_SCENARIOS), "allowed_async_concurrent")
CALL_SCENARIOS = (*SYNC_SCENARIOS, *ASYNC_SCENARIOS)
DEFAULT_SCENARIOS = (*CALL_SCENARIOS, "contention")

# (scenario, db) -> (comparison, bound). µs: ours/reference must be <= bound; contention:
# ours/reference must be >= bound. "duplicate and denied <= 0.5x" carries no database in the
# issue, so it is applied to both.
TARGETS: dict[tuple[str, str], tuple[str, float]] = {
    ("allowed", "sqlite"): ("<=", 0.5),
    ("duplicate", "sqlite"): ("<=", 0.5),
    ("denied", "sqlite"): ("<=", 0.5),
    ("allowed", "postgresql"): ("<=", 0.3),
    ("duplicate", "postgresql"): ("<=", 0.5),
    ("denied", "postgresql"): ("<=", 0.5),
    ("contention", "sqlite"): (">=", 2.0),
    ("contention", "postgresql"): (">=", 2.0),
}

# (scenario, db) -> bound: ours/floor must be <= bound (the issue: an allowed call <= 3x the floor on
# SQLite, <= 1.5x on PostgreSQL, sync and async).
FLOOR_TARGETS: dict[tuple[str, str], float] = {
    (scenario, db): bound for scenario in ("allowed", "allowed_async")
    for db, bound in (("sqlite", 3.0), ("postgresql", 1.5))
}


def floor_field(scenario: str) -> str | None:
    """Which of the floor's medians a scenario is read against: an allowed (or approved) call makes the
    floor's two commits, a refusal (duplicate, denied) its one."""
    base = scenario.split("_async")[0]
    return {"allowed": "floor_allowed", "approval": "floor_allowed", "duplicate": "floor_refused",
            "denied": "floor_refused", "allowed_budget": "floor_allowed"}.get(base)


# Variables that would point either implementation at another store or project.
SCRUBBED_ENV = ("CTRLRUN_STORE_URL", "DATABASE_URL", "CTRLRUN_STATE", "CTRLRUN_CONFIG", "CTRLRUN_ENVIRONMENT",
                "DJANGO_SETTINGS_MODULE", "PYTHONPATH", "PYTHONHOME", "REFPG_URL", "FLOOR_URL")


# =========================================================================== worker side
# Everything below until the driver runs inside the measured interpreter; it imports ctrlrun
# only after chdir() into the fresh folder, so the embedded default finds ./ctrlrun.yaml.


def _emit(payload: dict[str, Any]) -> None:
    sys.stdout.write(RESULT_MARK + json.dumps(payload) + "\n")
    sys.stdout.flush()


def _describe(ctrlrun: Any) -> dict[str, Any]:
    from importlib import metadata

    try:
        version = metadata.version("ctrlrun")
    except metadata.PackageNotFoundError:
        version = getattr(ctrlrun, "__version__", "?")
    return {"module": ctrlrun.__file__, "version": version, "python": platform.python_version(),
            "flavour": _flavour(ctrlrun)}


def _flavour(ctrlrun: Any) -> str:
    """"ours" or "reference", by a module only ours has (both now have ``ctrlrun.Control``)."""
    from importlib.util import find_spec

    return "ours" if find_spec("ctrlrun.standalone") is not None else "reference"


def _store_in_use(ctrlrun: Any) -> str:
    """Which store the default configuration really opened (catches a shim that did not load)."""
    if _flavour(ctrlrun) == "ours":
        from ctrlrun import standalone

        return standalone.describe_store()
    from ctrlrun import control  # the reference; a private name, read only to report the store

    return type(control._default_control().store).__name__


def _granter(ctrlrun: Any):
    """A function granting one approval request through the implementation's own surface."""
    if _flavour(ctrlrun) == "ours":
        from ctrlrun import store

        def grant(request_id: str) -> None:
            store.answer_approval(request_id, True, by="bench-approver")

        return grant

    import contextlib
    import io

    from ctrlrun.cli.main import main as cli  # the reference's `ctrlrun` command (click)

    def grant(request_id: str) -> None:
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            try:
                cli.main(["approve", request_id], prog_name="ctrlrun", standalone_mode=False)
            except SystemExit as exc:  # pragma: no cover - click exits on usage errors
                if exc.code:
                    raise RuntimeError(f"ctrlrun approve {request_id} exited {exc.code}: {out.getvalue()}")
        if "granted" not in out.getvalue():
            raise RuntimeError(f"ctrlrun approve {request_id} did not grant: {out.getvalue().strip()}")

    return grant


class _Calls(NamedTuple):
    """A scenario's request to its driver: make these protected calls and send back, for each, its
    result or the ctrlrun refusal it raised. One call is awaited directly; several are made at once
    (``asyncio.gather``) by the async driver, in turn by the sync one."""

    calls: list[dict[str, Any]]
    approval: str | None = None  # made inside ``with_approval(approval)``


class _Grant(NamedTuple):
    """A scenario's request to its driver: grant this approval request (untimed)."""

    request_id: str


class _Session:
    """One worker's measurement, written once as a generator and driven by the sync or the async
    driver: it yields ``_Calls`` / ``_Grant`` and times the yields, so both drivers run the same
    scenario and the async per-call cost includes the driver's hops to its store threads."""

    def __init__(self, ctrlrun: Any, scenario: str, calls: int, rounds: int, floors: Any = None,
                 block: int = 0) -> None:
        self.ctrlrun, self.calls, self.rounds = ctrlrun, calls, rounds
        self.concurrent = scenario.endswith("_concurrent")
        self.base = scenario.split("_async")[0]
        self.expected_runs = 0
        self.per_round: list[float] = []
        self.clock = time.perf_counter
        # The in-process floors (bench/inprocess_floor.py), run in blocks between the scenario's own;
        # concurrent calls stay one block (all at once is the scenario).
        self.floors = floors
        self.blocks = inprocess_floor.blocks(calls, 0 if floors is None or self.concurrent else block)

    def session(self) -> Generator[Any, Any, None]:
        run = {"allowed": self.allowed, "duplicate": self.duplicate, "denied": self.denied,
               "approval": self.approval, "allowed_budget": self.allowed}[self.base]
        # The first call configures the store (migrations) untimed; then the scenario's own path is warmed.
        self._check("warmup", (yield _Calls([{"payment_id": "warmup", "amount": 1}])), None)
        self.expected_runs += 1
        yield from run("w", max(3, min(self.calls, 20)))
        if self.floors is not None:
            self.floors.warm(max(3, min(self.blocks[0], 20)))
        for round_no in range(self.rounds):
            if self.floors is None:
                self.per_round.append((yield from run(f"r{round_no}", self.calls)) / self.calls * 1e6)
                continue
            # Blocks of the scenario alternating with blocks of the floors; who goes first alternates too.
            total = 0.0
            for b, n in enumerate(self.blocks):
                if (b + round_no) % 2:
                    self.floors.block(n)
                total += yield from run(f"r{round_no}b{b}", n)
                if not (b + round_no) % 2:
                    self.floors.block(n)
            self.per_round.append(total / self.calls * 1e6)
            self.floors.end_round(self.calls)

    def _make(self, tag: str, n: int, amount: int) -> Generator[Any, Any, list[Any]]:
        batch = [{"payment_id": f"{tag}_{i}", "amount": amount} for i in range(n)]
        if self.concurrent:
            return (yield _Calls(batch))
        outcomes: list[Any] = []
        for call in batch:
            outcomes += yield _Calls([call])
        return outcomes

    def _check(self, tag: str, outcomes: list[Any], expected: type | None) -> None:
        for n, outcome in enumerate(outcomes):
            refused = isinstance(outcome, BaseException)
            if expected is None and refused:
                raise SystemExit(f"{tag}_{n}: an allowed call was refused: {outcome!r}")
            if expected is not None and not isinstance(outcome, expected):
                raise SystemExit(f"{tag}_{n}: expected {expected.__name__}, got {outcome!r}"
                                 + ("" if refused else " (the call ran)"))

    def _timed(self, tag: str, n: int, amount: int, expected: type | None) -> Generator[Any, Any, float]:
        start = self.clock()
        outcomes = yield from self._make(tag, n, amount)
        elapsed = self.clock() - start
        self._check(tag, outcomes, expected)
        return elapsed

    def allowed(self, tag: str, n: int) -> Generator[Any, Any, float]:
        self.expected_runs += n
        return (yield from self._timed(tag, n, ALLOWED, None))

    def duplicate(self, tag: str, n: int) -> Generator[Any, Any, float]:
        self._check(tag, (yield from self._make(tag, n, ALLOWED)), None)  # untimed: commit the keys
        self.expected_runs += n
        return (yield from self._timed(tag, n, ALLOWED, self.ctrlrun.DuplicateEffect))

    def denied(self, tag: str, n: int) -> Generator[Any, Any, float]:
        return (yield from self._timed(tag, n, DENIED_AMOUNT, self.ctrlrun.ActionDenied))

    def approval(self, tag: str, n: int) -> Generator[Any, Any, float]:
        total = 0.0
        for i in range(n):
            call = {"payment_id": f"{tag}_{i}", "amount": APPROVED}
            (asked,) = yield _Calls([call])
            self._check(f"{tag}_{i} (unapproved)", [asked], self.ctrlrun.ApprovalRequired)
            yield _Grant(asked.request_id)
            start = self.clock()
            (outcome,) = yield _Calls([call], asked.request_id)
            total += self.clock() - start
            self._check(f"{tag}_{i} (approved)", [outcome], None)
            self.expected_runs += 1
        return total


class _Exchange:
    """The driver's side of a session: iterate over its requests, ``reply()`` to each."""

    def __init__(self, steps: Generator[Any, Any, None]) -> None:
        self.steps, self.outcome = steps, None

    def __iter__(self) -> Iterator[Any]:
        while True:
            try:
                yield self.steps.send(self.outcome)
            except StopIteration:
                return

    def reply(self, outcome: Any) -> None:
        self.outcome = outcome


def _presenting(ctrlrun: Any, approval: str | None) -> Any:
    return ctrlrun.with_approval(approval) if approval else contextlib.nullcontext()


def _drive_sync(ctrlrun: Any, refund: Any, grant: Any, steps: Generator[Any, Any, None]) -> None:
    def call(kwargs: dict[str, Any], approval: str | None) -> Any:
        with _presenting(ctrlrun, approval):
            try:
                return refund(**kwargs)
            except ctrlrun.CTRLRunError as exc:
                return exc

    exchange = _Exchange(steps)
    for request in exchange:
        if isinstance(request, _Grant):
            exchange.reply(grant(request.request_id))
        else:
            exchange.reply([call(kwargs, request.approval) for kwargs in request.calls])


async def _drive_async(ctrlrun: Any, refund: Any, grant: Any, steps: Generator[Any, Any, None]) -> None:
    import asyncio

    async def call(kwargs: dict[str, Any], approval: str | None) -> Any:
        with _presenting(ctrlrun, approval):
            try:
                return await refund(**kwargs)
            except ctrlrun.CTRLRunError as exc:
                return exc

    exchange = _Exchange(steps)
    for request in exchange:
        if isinstance(request, _Grant):  # the store is sync-only: grant from a thread, as a console would
            exchange.reply(await asyncio.to_thread(grant, request.request_id))
        elif len(request.calls) == 1:  # awaited directly: no task per call
            exchange.reply([await call(request.calls[0], request.approval)])
        else:
            exchange.reply(await asyncio.gather(*(call(kwargs, request.approval) for kwargs in request.calls)))


def worker_calls(scenario: str, calls: int, rounds: int, args: argparse.Namespace) -> dict[str, Any]:
    import ctrlrun

    executed: list[str] = []
    is_async = "_async" in scenario

    def refund_sync(payment_id: str, amount: int) -> dict:
        executed.append(payment_id)
        return {"id": f"re_{payment_id}", "amount": amount}

    async def refund_async(payment_id: str, amount: int) -> dict:
        return refund_sync(payment_id, amount)

    options: dict[str, Any] = {}
    # Both read the policy file's `authority:` section in their default Control (the reference's
    # Control.from_file loads it), so the budget scenario needs no special wiring on either side.
    try:
        refund = ctrlrun.protect("stripe.refund", effect="refund:{payment_id}", **options)(
            refund_async if is_async else refund_sync)
    except Exception as exc:
        if not is_async or _flavour(ctrlrun) == "ours":
            raise
        # The reference refuses to protect an `async def` (at decoration): nothing to measure.
        return {**_describe(ctrlrun), "scenario": scenario, "not_applicable": "refuses async def",
                "detail": f"{type(exc).__name__}: {exc}"[:300]}

    granters: list[Any] = []

    def grant(request_id: str) -> None:
        if not granters:  # made on first use: ours imports its store only once the store is configured
            granters.append(_granter(ctrlrun))
        granters[0](request_id)

    floors = None
    if args.floor_block and floor_field(scenario):
        floors = inprocess_floor.for_worker(
            ctrlrun, scenario, floor_field(scenario), ours=_flavour(ctrlrun) == "ours", protect_options=options,
            allowed=ALLOWED, denied=DENIED_AMOUNT, floor_script=args.floor_script, floor_url=args.floor_url,
            own_floor_url=args.own_floor_url)
    measured = _Session(ctrlrun, scenario, calls, rounds, floors, args.floor_block)
    with ctrlrun.context(agent="bench-agent"):
        if is_async:
            import asyncio

            asyncio.run(_drive_async(ctrlrun, refund, grant, measured.session()))  # every call in one loop
        else:
            _drive_sync(ctrlrun, refund, grant, measured.session())
    if len(executed) != measured.expected_runs:
        raise SystemExit(f"executed {len(executed)} calls, expected {measured.expected_runs}")
    if "budget" in scenario and _flavour(ctrlrun) == "ours":
        from ctrlrun import store

        if store.ledger_rows() < measured.expected_runs:  # one row per budgeted metric per call
            raise SystemExit(f"the budget ledger has {store.ledger_rows()} rows for {measured.expected_runs} calls")
    extra: dict[str, Any] = {}
    if floors is not None:
        floors.close()
        extra = {**floors.results(), "floor_block": args.floor_block, "blocks_per_round": len(measured.blocks)}
        if floors.errors:
            extra["inproc_floor_error"] = "; ".join(floors.errors)
    return {**_describe(ctrlrun), "store": _store_in_use(ctrlrun), "scenario": scenario, "calls": calls,
            "rounds": rounds, "per_round_us": measured.per_round, "median_us": statistics.median(measured.per_round),
            **extra}


def worker_contention_child(index: int, keys: int, races: int) -> dict[str, Any]:
    import ctrlrun

    log = Path("executions.log")

    @ctrlrun.protect("ledger.post", effect="post:{entry_id}")
    def post(entry_id: str) -> str:
        with open(log, "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            handle.write(f"{entry_id}\n")
        return entry_id

    ran = refused = other = 0
    samples: list[str] = []
    with ctrlrun.context(agent=f"worker-{index}"):
        post(entry_id=f"warm-{index}")  # connection and store opened before the race
        if index < 0:  # the setup run: it only creates the store
            return {"index": index, "ran": 0, "refused": 0, "other": 0, "samples": []}
        for race in range(races):
            Path(f"ready-{race}-{index}").touch()
            go = Path(f"go-{race}")
            while not go.exists():
                time.sleep(0.002)
            order = range(keys) if index % 2 == 0 else reversed(range(keys))
            for k in order:
                try:
                    post(entry_id=f"r{race}k{k}")
                    ran += 1
                except ctrlrun.DuplicateEffect:
                    refused += 1
                except Exception as exc:  # another refusal class, or a store error: counted, shown
                    other += 1
                    if len(samples) < 3:
                        samples.append(f"{type(exc).__name__}: {exc}"[:300])
            Path(f"done-{race}-{index}.tmp").write_text(repr(time.time()))
            os.replace(f"done-{race}-{index}.tmp", f"done-{race}-{index}")
    return {"index": index, "ran": ran, "refused": refused, "other": other, "samples": samples}


def worker_contention(workers: int, keys: int, races: int, timeout: float) -> dict[str, Any]:
    """``races`` races over fresh keys in one store, the same processes; median attempts/s."""
    here = Path.cwd()
    base = [sys.executable, str(HERE), "--worker", "contention-child", "--dir", str(here), "--races", str(races)]

    def result_of(stdout: str) -> dict[str, Any]:
        for line in stdout.splitlines():
            if line.startswith(RESULT_MARK):
                return json.loads(line[len(RESULT_MARK):])
        raise RuntimeError("no result")

    def wait_for(names: list[str], deadline: float) -> bool:
        while not all((here / name).exists() for name in names):
            codes = [c.poll() for c in children]
            if any(codes) or all(code is not None for code in codes) or time.time() > deadline:
                return all((here / name).exists() for name in names)  # a last look: it may just have landed
            time.sleep(0.002)
        return True

    # One process creates the store first, so the race is for keys, not for the schema.
    setup = subprocess.run([*base, "--index", "-1", "--keys", "0"], capture_output=True, text=True, timeout=timeout)
    if setup.returncode:
        raise SystemExit(f"contention setup failed:\n{setup.stderr[-3000:]}")
    children = [subprocess.Popen([*base, "--index", str(n), "--keys", str(keys)], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True) for n in range(workers)]
    deadline = time.time() + timeout
    elapsed: list[float] = []
    try:
        for race in range(races):
            if not wait_for([f"ready-{race}-{n}" for n in range(workers)], deadline):
                break
            started = time.time()
            (here / f"go-{race}").touch()
            if not wait_for([f"done-{race}-{n}" for n in range(workers)], deadline):
                break
            ended = max(float((here / f"done-{race}-{n}").read_text()) for n in range(workers))
            elapsed.append(ended - started)
        outputs = [c.communicate(timeout=max(1.0, deadline - time.time())) for c in children]
    finally:
        for c in children:
            if c.poll() is None:
                c.kill()
    results = []
    for child, (out, err) in zip(children, outputs):
        if child.returncode:
            raise SystemExit(f"contention worker exited {child.returncode}:\n{err[-3000:]}")
        results.append(result_of(out))
    if len(elapsed) != races:
        raise SystemExit(f"contention: only {len(elapsed)} of {races} races finished")
    with open(here / "executions.log") as handle:
        counts = Counter(line.strip() for line in handle if line.startswith("r"))
    expected = [f"r{race}k{k}" for race in range(races) for k in range(keys)]
    twice = {k: c for k, c in counts.items() if c > 1}
    never = [k for k in expected if k not in counts]
    rates = [workers * keys / e for e in elapsed]
    import ctrlrun

    return {
        **_describe(ctrlrun), "scenario": "contention", "workers": workers, "keys": keys, "races": races,
        "attempts": workers * keys, "elapsed_s": elapsed, "per_race": rates,
        "attempts_per_s": statistics.median(rates),
        "ran": sum(r["ran"] for r in results), "refused": sum(r["refused"] for r in results),
        "other": sum(r["other"] for r in results), "samples": [s for r in results for s in r["samples"]][:5],
        "executed_twice": len(twice), "twice_examples": sorted(twice.items())[:5], "never_executed": len(never),
        "exactly_once": not twice and not never,
    }


def worker_main(args: argparse.Namespace) -> int:
    os.chdir(args.dir)
    if not Path("ctrlrun.yaml").exists():
        Path("ctrlrun.yaml").write_text(BUDGET_POLICY if "budget" in (args.worker or "") else POLICY)
    if args.worker in CALL_SCENARIOS:
        _emit(worker_calls(args.worker, args.calls, args.rounds, args))
    elif args.worker == "contention":
        _emit(worker_contention(args.workers, args.keys, args.races, args.timeout))
    elif args.worker == "contention-child":
        _emit(worker_contention_child(args.index, args.keys, args.races))
    else:
        raise SystemExit(f"unknown worker scenario {args.worker!r}")
    return 0


# =========================================================================== driver side


def _database_url(server: str, name: str) -> str:
    parts = urlsplit(server)
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


class Databases:
    """Throwaway PostgreSQL databases: one per worker run, all dropped at the end."""

    def __init__(self, server: str) -> None:
        self.server = server
        self.admin = _database_url(server, "postgres")
        self.made: list[str] = []

    def _execute(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(self.admin, autocommit=True) as conn:
            conn.execute(sql)

    def version(self) -> str:
        import psycopg

        with psycopg.connect(self.admin, autocommit=True) as conn:
            return str(conn.execute("SHOW server_version").fetchone()[0])

    def create(self, label: str) -> str:
        name = f"ctrlrun_cmp_{os.getpid()}_{len(self.made)}_{label}"[:63]
        self._execute(f'CREATE DATABASE "{name}"')
        self.made.append(name)
        return _database_url(self.server, name)

    def drop(self, url: str) -> None:
        name = urlsplit(url).path.lstrip("/")
        self._execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if name in self.made:
            self.made.remove(name)

    def drop_all(self) -> None:
        for name in list(self.made):
            try:
                self._execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            except Exception as exc:  # keep dropping the others
                print(f"warning: could not drop database {name}: {exc}", file=sys.stderr)
            self.made.remove(name)


@contextlib.contextmanager
def _scratch(label: str, db: str, args: argparse.Namespace,
             databases: Databases | None) -> Iterator[tuple[str, str | None]]:
    """A fresh empty folder and, on PostgreSQL, a fresh database; both removed afterwards."""
    workdir = tempfile.mkdtemp(prefix=f"ctrlrun-compare-{label}-{db}-")
    url = None
    try:
        if db == "postgresql":
            assert databases is not None
            url = databases.create(label.replace("-", "_"))
        yield workdir, url
    finally:
        if url and databases is not None:
            try:
                databases.drop(url)
            except Exception as exc:
                print(f"warning: could not drop {url}: {exc}", file=sys.stderr)
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"kept {workdir}", file=sys.stderr)


def _run(cmd: list[str], env: dict[str, str], args: argparse.Namespace,
         cwd: str | None = None) -> subprocess.CompletedProcess | dict[str, Any]:
    """The finished process, or ``{"error": ...}`` when it timed out or exited non-zero."""
    try:
        proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {args.timeout:.0f}s"}
    if proc.returncode:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-6:]
        return {"error": f"exit {proc.returncode}: " + " | ".join(tail)}
    return proc


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in SCRUBBED_ENV}


def run_worker(impl: str, python: str, scenario: str, db: str, args: argparse.Namespace,
               databases: Databases | None) -> dict[str, Any]:
    env = _clean_env()
    with _scratch(f"{impl}-{scenario}", db, args, databases) as (workdir, url):
        if impl == "ours":
            env["PYTHONPATH"] = str(REPO)
            if url:
                env["CTRLRUN_STORE_URL"] = url
        elif url:
            env["PYTHONPATH"] = args.reference_pg_shim
            env["REFPG_URL"] = url  # the shim: protect()'s default Control on PostgresStateStore
            env["CTRLRUN_STORE_URL"] = url  # the reference's CLI (the approval grant) honours this
        cmd = [python, str(HERE), "--worker", scenario, "--dir", workdir, "--timeout", str(args.timeout)]
        extra_dbs: list[str] = []
        if scenario == "contention":
            cmd += ["--workers", str(args.workers), "--keys", str(args.keys), "--races", str(args.races)]
        else:
            calls = args.approval_calls if scenario.startswith("approval") else args.calls
            cmd += ["--calls", str(calls), "--rounds", str(args.rounds), "--floor-block", str(args.floor_block),
                    "--floor-script", args.floor_script]
            if url and args.floor_block and floor_field(scenario):
                assert databases is not None  # scratch databases of their own for the in-process floors
                extra_dbs.append(databases.create("inproc_floor"))
                cmd += ["--floor-url", extra_dbs[-1]]
                if impl == "ours":
                    extra_dbs.append(databases.create("own_floor"))
                    cmd += ["--own-floor-url", extra_dbs[-1]]
        try:
            proc = _run(cmd, env, args)
        finally:
            for extra in extra_dbs:
                with contextlib.suppress(Exception):
                    databases.drop(extra)
        if isinstance(proc, dict):
            return proc
        result = next((json.loads(line[len(RESULT_MARK):]) for line in proc.stdout.splitlines()
                       if line.startswith(RESULT_MARK)), None)
        if result is None:
            return {"error": "no result line: " + " | ".join(proc.stdout.strip().splitlines()[-3:])}
        # The interpreter must have imported the implementation we think it did, and known it.
        inside = Path(result["module"]).resolve().is_relative_to(REPO)
        if inside != (impl == "ours") or result.get("flavour") != impl:
            return {"error": f"{impl} run imported ctrlrun from {result['module']} "
                             f"(it took itself for {result.get('flavour')!r})"}
        if "not_applicable" in result:
            return result
        if db == "postgresql" and scenario != "contention" and "postgres" not in result.get("store", "").lower():
            return {"error": f"{impl} run on PostgreSQL used store {result.get('store')!r} (shim not loaded?)"}
        return result


FLOOR_LINE = re.compile(r"^(floor_\w+)\s+median\s+([0-9.]+)", re.MULTILINE)


def run_floor(db: str, args: argparse.Namespace, databases: Databases | None) -> dict[str, Any]:
    """``floor.py`` with the same ``--calls``/``--rounds``: the raw driver's durable writes, nothing else.

    On SQLite it makes its own temporary folder (``TMPDIR`` points it into ours, removed after); on
    PostgreSQL it gets a scratch database of its own."""
    env = _clean_env()
    with _scratch("floor", db, args, databases) as (workdir, url):
        env["TMPDIR"] = workdir
        cmd = [sys.executable, args.floor_script, "--calls", str(args.calls), "--rounds", str(args.rounds)]
        proc = _run(cmd + (["--url", url] if url else []), env, args, cwd=workdir)
        if isinstance(proc, dict):
            return proc
        medians = {name: float(value) for name, value in FLOOR_LINE.findall(proc.stdout)}
        if set(medians) != {"floor_allowed", "floor_refused"}:
            return {"error": f"floor printed {sorted(medians)}: " + " | ".join(proc.stdout.strip().splitlines()[-3:])}
        return medians


def _verdict(bound: tuple[str, float] | None, ratio: float | None, against: str) -> str | None:
    if bound is None:
        return None
    op, value = bound
    text = f"{op} {value:g}x {against}: "
    if ratio is None:
        return text + "not measured"
    met = ratio <= value if op == "<=" else ratio >= value
    return text + ("met" if met else "NOT met")


def _targets(scenario: str, db: str, vs_ref: float | None, vs_floor: float | None) -> str:
    floor_bound = FLOOR_TARGETS.get((scenario, db))
    verdicts = [_verdict(TARGETS.get((scenario, db)), vs_ref, "ref"),
                _verdict(("<=", floor_bound) if floor_bound else None, vs_floor, "floor")]
    return "; ".join(v for v in verdicts if v) or "-"


def _sqlite_version(python: str) -> str:
    try:
        out = subprocess.run([python, "-c", "import sqlite3; print(sqlite3.sqlite_version)"], capture_output=True,
                             text=True, timeout=30)
        return out.stdout.strip() or "?"
    except Exception:
        return "?"


def _markdown(header: list[str], rows: list[list[str]], right: set[int]) -> list[str]:
    """A Markdown table, padded so it also reads as plain text."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.rjust(w) if i in right else c.ljust(w)
                                 for i, (c, w) in enumerate(zip(cells, widths))) + " |"

    rule = "|" + "|".join(("-" * (w + 1) + ":") if i in right else "-" * (w + 2) for i, w in enumerate(widths)) + "|"
    return [line(header), rule, *(line(r) for r in rows)]


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def _x(ratio: float | None) -> str:
    return f"{ratio:.2f}x" if ratio else "-"


def driver_main(args: argparse.Namespace) -> int:
    dbs = ["sqlite", "postgresql"] if args.db == "both" else [args.db]
    reference = args.reference_python
    impls: list[tuple[str, str]] = [("ours", sys.executable)]
    if reference and Path(reference).exists():
        impls.append(("reference", reference))
    else:
        print(f"note: no reference interpreter at {reference!r}; measuring ours only. Create it with:\n"
              f"  python3 -m venv /tmp/ref && /tmp/ref/bin/pip install ctrlrun==0.12.2 'psycopg[binary]'\n"
              f"(and for the reference on PostgreSQL, the measurement shim in {args.reference_pg_shim}/sitecustomize.py)",
              file=sys.stderr)
    if "postgresql" in dbs and len(impls) == 2 and not (Path(args.reference_pg_shim) / "sitecustomize.py").exists():
        print(f"note: no shim at {args.reference_pg_shim}/sitecustomize.py; the reference is skipped on PostgreSQL",
              file=sys.stderr)
    databases = Databases(args.pg_url) if "postgresql" in dbs else None
    pg_version = "?"
    if databases is not None:
        try:
            pg_version = databases.version()
        except Exception as exc:
            print(f"error: PostgreSQL at {args.pg_url} is not reachable ({exc}); use --db sqlite", file=sys.stderr)
            return 2

    scenarios = [s for s in args.scenarios.split(",") if s]
    per_call = [s for s in scenarios if s != "contention"]
    with_floor = bool(per_call) and Path(args.floor_script).exists()
    if per_call and not with_floor:
        print(f"note: no floor script at {args.floor_script}; the floor columns stay empty", file=sys.stderr)
    passes: dict[tuple[str, str, str], list[dict[str, Any]]] = {}

    def measure(what: str, db: str, impl: str, label: str, run: Any) -> None:
        print(f"... {what:24s} {db:10s} {impl}{label}", file=sys.stderr, flush=True)
        began = time.time()
        result = run()
        print(f"    {time.time() - began:.1f}s" + (f"  ERROR {result['error']}" if "error" in result else ""),
              file=sys.stderr, flush=True)
        passes.setdefault((what, db, impl), []).append(result)

    def the_floor(db: str, label: str) -> None:
        if with_floor:
            measure("floor", db, "floor", label, lambda: run_floor(db, args, databases))

    def the_scenarios(db: str, label: str, pass_no: int) -> None:
        for n, scenario in enumerate(scenarios):
            # Alternate who runs first, by scenario and by pass, so drift in the machine's
            # load does not always favour the same side.
            order = impls if (n + pass_no) % 2 == 0 else list(reversed(impls))
            for impl, python in order:
                if (impl == "reference" and db == "postgresql"
                        and not (Path(args.reference_pg_shim) / "sitecustomize.py").exists()):
                    passes.setdefault((scenario, db, impl), []).append({"error": "no PostgreSQL shim for the reference"})
                else:
                    measure(scenario, db, impl, label, lambda: run_worker(impl, python, scenario, db, args, databases))

    try:
        for pass_no in range(args.passes):
            label = f" (pass {pass_no + 1}/{args.passes})" if args.passes > 1 else ""
            for db in dbs:
                # The floor runs in every pass too: before the others in one pass, after them in the next.
                if pass_no % 2 == 0:
                    the_floor(db, label)
                the_scenarios(db, label, pass_no)
                if pass_no % 2 == 1:
                    the_floor(db, label)
    finally:
        if databases is not None:
            databases.drop_all()

    results = {key: _merge(runs) for key, runs in passes.items()}
    missing: dict[str, Any] = {"error": "-"}
    failed = False
    spreads: list[str] = []
    floor_errors: list[str] = []
    floor_notes: list[str] = []
    if per_call:
        rows = []
        for db in dbs:
            floor = results.get(("floor", db, "floor"), missing)
            failed |= with_floor and "error" in floor
            for scenario in per_call:
                ours = results[(scenario, db, "ours")]
                ref = results.get((scenario, db, "reference"), missing)
                field = floor_field(scenario)
                f = floor.get(field) if field else None
                o, r = ours.get("median_us"), ref.get("median_us")
                failed |= "error" in ours or (len(impls) == 2 and "error" in ref)
                # In-process floors: each side read against the floor measured in its own process.
                fo, fr, own = ours.get("inproc_floor_us"), ref.get("inproc_floor_us"), ours.get("own_floor_us")
                for side, result in (("ours", ours), ("reference", ref)):
                    if "inproc_floor_error" in result:
                        floor_errors.append(f"{scenario} {db} {side}: {result['inproc_floor_error']}")
                    if "inproc_floor_note" in result and result["inproc_floor_note"] not in floor_notes:
                        floor_notes.append(result["inproc_floor_note"])
                inproc = " / ".join(f"{v:.1f}" if v else "-" for v in (fo, fr)) if fo or fr else "-"
                rows.append([scenario, db, _num(o, ours), _num(r, ref), _x(_ratio(o, r)),
                             f"{f:.1f}" if f else ("ERROR" if "error" in floor and floor["error"] != "-" else "-"),
                             _x(_ratio(o, f)), _x(_ratio(r, f)), inproc, _x(_ratio(o, fo)), _x(_ratio(r, fr)),
                             f"{own:.1f}" if own else "-", _x(_ratio(o, own)),
                             _targets(scenario, db, _ratio(o, r), _ratio(o, f))])
                if args.passes > 1:
                    spreads.append(f"- {scenario} {db}: ours {_passes(ours, 'median_us')}, "
                                   f"reference {_passes(ref, 'median_us')}, floor {_passes(floor, field)}, "
                                   f"in-process floor {_passes(ours, 'inproc_floor_us')} (ours) / "
                                   f"{_passes(ref, 'inproc_floor_us')} (reference), "
                                   f"own floor {_passes(ours, 'own_floor_us')}")
        print()
        for line in _markdown(["scenario", "db", "ours µs", "reference µs", "ours/ref", "floor µs", "ours/floor",
                               "ref/floor", "floor(in-process) µs ours / ref", "ours/floor(in-process)",
                               "ref/floor(in-process)", "own-floor µs", "ours/own-floor", "target"], rows,
                              right=set(range(2, 13))):
            print(line)
        failed |= bool(floor_errors)
        for line in floor_notes:
            print(f"\nnote: {line}")
        for line in floor_errors:
            print(f"\nerror: in-process floor: {line}")
    if "contention" in scenarios:
        rows = []
        for db in dbs:
            ours = results[("contention", db, "ours")]
            ref = results.get(("contention", db, "reference"), missing)
            o, r = ours.get("attempts_per_s"), ref.get("attempts_per_s")
            failed |= "error" in ours or not ours.get("exactly_once", False)
            failed |= len(impls) == 2 and ("error" in ref or not ref.get("exactly_once", False))
            rows.append(["contention", db, _num(o, ours, 0), _num(r, ref, 0), _x(_ratio(o, r)),
                         _targets("contention", db, _ratio(o, r), None), f"{_once(ours)} / {_once(ref)}"])
            if args.passes > 1:
                spreads.append(f"- contention {db}: ours {_passes(ours, 'attempts_per_s', 0)}, "
                               f"reference {_passes(ref, 'attempts_per_s', 0)}")
        print()
        for line in _markdown(["scenario", "db", "ours att/s", "reference att/s", "ours/ref", "target",
                               "exactly once (ours / reference)"], rows, right={2, 3, 4}):
            print(line)
        print()
        for db in dbs:
            for impl, _ in impls:
                res = results.get(("contention", db, impl), {})
                if "attempts" in res:
                    races = ", ".join(f"{r:.0f}" for r in res["per_race"])
                    print(f"- {db} {impl}: {res['races']} races of {res['workers']} workers x {res['keys']} keys "
                          f"({races} att/s); ran {res['ran']}, refused as duplicate {res['refused']}, "
                          f"other {res['other']}"
                          + (f"; e.g. {res['samples'][0]}" if res["samples"] else ""))
    if spreads:
        print()
        print(f"each pass ({args.passes}), in order:")
        print("\n".join(spreads))
    errors = [(k, v["error"]) for k, v in results.items() if "error" in v]
    if errors:
        print()
        for (scenario, db, impl), error in errors:
            print(f"error: {scenario} {db} {impl}: {error}")

    ref_any = next((v for (s, d, i), v in results.items() if i == "reference" and "version" in v), {})
    ours_any = next((v for (s, d, i), v in results.items() if i == "ours" and "version" in v), {})
    print()
    print(f"machine: Python {platform.python_version()} (ours) / {ref_any.get('python', '-')} (reference); "
          f"SQLite {_sqlite_version(sys.executable)}"
          + (f"; PostgreSQL {pg_version}" if databases is not None else "")
          + f"; {os.cpu_count()} CPUs ({len(os.sched_getaffinity(0))} usable); {platform.system()} "
            f"{platform.machine()}; {dt.datetime.now().astimezone().isoformat(timespec='seconds')}")
    print(f"ours: ctrlrun {ours_any.get('version', '?')} from {REPO}; reference: ctrlrun {ref_any.get('version', '-')} "
          f"via {reference if len(impls) == 2 else '(not run)'}; floor: "
          + (args.floor_script if with_floor else "(not run)"))
    how = []
    if per_call:
        how.append(f"per-call: median over {args.rounds} rounds of the mean µs per call ({args.calls} calls/round"
                   + (f"; approval {args.approval_calls}" if any(s.startswith("approval") for s in per_call) else "")
                   + ("; allowed_async_concurrent: all at once, wall time / calls" if "allowed_async_concurrent"
                      in per_call else "") + ")")
    if with_floor:
        how.append("floor: same sizes; allowed and approval read against floor_allowed, duplicate and denied "
                   "against floor_refused")
    if per_call and args.floor_block:
        how.append(f"floor(in-process) and own-floor: inside each worker, blocks of {args.floor_block} calls "
                   "alternating with as many floor operations (own-floor: our captured statements replayed "
                   "through the bare driver on a copy of our store; ours only, not for approval)")
    if "contention" in scenarios:
        how.append(f"contention: median of {args.races} races, {args.workers} processes x {args.keys} keys each")
    print("; ".join(how) + (f"; each the median of {args.passes} passes" if args.passes > 1 else ""))
    return 1 if failed else 0


MERGED_FIELDS = ("median_us", "attempts_per_s", "floor_allowed", "floor_refused", "inproc_floor_us", "own_floor_us")


def _merge(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One result from ``--passes`` runs: the median of the pass medians; any error wins."""
    errors = [r["error"] for r in runs if "error" in r]
    if errors:
        return {"error": errors[0]}
    if len(runs) == 1 or "not_applicable" in runs[-1]:
        return runs[-1]
    merged = dict(runs[-1])
    merged["per_pass"] = {}
    for field in MERGED_FIELDS:
        if field in merged:
            merged[field] = statistics.median(r[field] for r in runs)
            merged["per_pass"][field] = [r[field] for r in runs]
    if "per_race" in merged:
        merged["per_race"] = [x for r in runs for x in r["per_race"]]
        merged["races"] = sum(r["races"] for r in runs)
        for field in ("ran", "refused", "other", "executed_twice", "never_executed"):
            merged[field] = sum(r[field] for r in runs)
        merged["exactly_once"] = all(r["exactly_once"] for r in runs)
        merged["samples"] = [s for r in runs for s in r["samples"]][:5]
    return merged


def _passes(result: dict[str, Any], field: str | None, digits: int = 0) -> str:
    values = result.get("per_pass", {}).get(field) if field else None
    return "/".join(f"{v:.{digits}f}" for v in values) if values else _num(None, result)


def _num(value: float | None, result: dict[str, Any], digits: int = 1) -> str:
    if "not_applicable" in result:
        return f"n/a ({result['not_applicable']})"
    if value is None:
        return "ERROR" if "error" in result and result["error"] != "-" else "-"
    return f"{value:.{digits}f}"


def _once(result: dict[str, Any]) -> str:
    if "exactly_once" not in result:
        return "-"
    if result["exactly_once"]:
        return "yes"
    return f"NO ({result['executed_twice']} twice, {result['never_executed']} never)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--db", choices=["sqlite", "postgresql", "both"], default="both")
    parser.add_argument("--calls", type=int, default=200, help="calls per round (default 200)")
    parser.add_argument("--approval-calls", type=int, default=None,
                        help="calls per round for the approval scenario (each needs a request and a grant; "
                             "default: --calls, at most 50)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workers", type=int, default=8, help="contention: racing processes (default 8)")
    parser.add_argument("--keys", type=int, default=200, help="contention: keys every worker tries (default 200)")
    parser.add_argument("--passes", type=int, default=1,
                        help="repeat every measurement this many times, alternating who goes first, and "
                             "report the median (use 3 on a busy machine)")
    parser.add_argument("--races", type=int, default=3,
                        help="contention: races (fresh keys each, same processes and store); median reported")
    parser.add_argument("--scenarios", default=",".join(DEFAULT_SCENARIOS),
                        help=f"comma-separated subset of {', '.join(DEFAULT_SCENARIOS)} (default: all)")
    parser.add_argument("--floor-script", default=str(REPO.parent / "shared" / "bench" / "floor.py"),
                        help="the floor (the raw driver's durable writes), run on each database in every pass "
                             "(default: ../shared/bench/floor.py beside the repository)")
    parser.add_argument("--floor-block", type=int, default=25,
                        help="in-process floors: blocks of this many scenario calls alternate, inside each "
                             "worker, with as many floor operations (0: no in-process floors; default 25)")
    parser.add_argument("--reference-python", default="/tmp/ref/bin/python")
    parser.add_argument("--reference-pg-shim", default=str(Path(__file__).resolve().parent / "reference_pg"),
                        help="folder holding the reference's PostgreSQL measurement sitecustomize.py")
    parser.add_argument("--pg-url", default="postgresql://postgres@127.0.0.1:5432",
                        help="PostgreSQL server for the throwaway databases")
    parser.add_argument("--timeout", type=float, default=900, help="seconds allowed per worker run")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folders (printed on stderr)")
    # worker mode
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    parser.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--floor-url", help=argparse.SUPPRESS)
    parser.add_argument("--own-floor-url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker_main(args)
    if args.approval_calls is None:
        args.approval_calls = min(args.calls, 50)
    for name in ("calls", "approval_calls", "rounds", "workers", "keys", "races", "passes"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.floor_block < 0:
        parser.error("--floor-block must be 0 (no in-process floors) or more")
    unknown = set(args.scenarios.split(",")) - {*DEFAULT_SCENARIOS, ""}
    if unknown:
        parser.error(f"unknown scenario(s): {', '.join(sorted(unknown))}")
    return driver_main(args)


if __name__ == "__main__":
    sys.exit(main())
