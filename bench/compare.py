#!/usr/bin/env python3
"""This project's ctrlrun beside the reference implementation (PyPI ``ctrlrun==0.12.2``), one run.

    python bench/compare.py                                   # both databases, default sizes
    python bench/compare.py --db sqlite --calls 100 --rounds 3
    python bench/compare.py --reference-python /path/to/venv/bin/python

The driver runs every measurement twice, in separate processes: once with this interpreter and
``PYTHONPATH`` set to the repository root (so ``/work/main``'s ``ctrlrun`` is imported), once with
``--reference-python`` (a virtualenv holding the reference package). Each run is this same file
in worker mode, ``compare.py --worker SCENARIO --dir DIR ...``, which imports whichever
``ctrlrun`` its interpreter has and prints one JSON line. Every worker gets a fresh empty folder
holding only ``ctrlrun.yaml`` (the embedded SQLite store lands in its ``.ctrlrun/``), and on
PostgreSQL a fresh database, dropped afterwards.

Scenarios (per-call cost: mean µs per call in each round, median over ``--rounds``):

- ``allowed``    an allowed call with a fresh effect key (reserve, run, record);
- ``duplicate``  a call whose key is already committed, refused (``DuplicateEffect``); the keys are
                 committed untimed first;
- ``denied``     a call the policy denies (``ActionDenied``);
- ``approval``   an approval presented: request (``ApprovalRequired``) and grant are untimed, only
                 the call inside ``with_approval(request_id)`` is timed;
- ``contention`` ``--workers`` OS processes race over the same ``--keys`` keys (half walk them
                 forwards, half backwards); throughput is attempts/s from the common start to the
                 last worker's end, median over ``--races`` races (fresh keys each, same processes
                 and store), and every key must have executed exactly once (an append-only log
                 under ``flock``).

The reference on PostgreSQL: its ``protect()`` ignores ``CTRLRUN_STORE_URL`` / ``DATABASE_URL``
and always uses SQLite, so its PostgreSQL runs go through the measurement shim in
``--reference-pg-shim`` (default ``bench/reference_pg``: a ``sitecustomize.py`` that, with ``REFPG_URL``
set, builds the reference's default ``Control`` on its own public ``PostgresStateStore``).
Approvals are granted through each implementation's own surface: ours with
``ctrlrun.store.answer_approval`` (what ``ctrlrun approve ID --by NAME`` calls), the reference's
with its ``ctrlrun approve ID`` command, invoked in-process (click), against the same store.

On a busy machine use ``--passes 3``: every measurement is repeated, alternating which side runs
first, and the median is reported with each pass's value beside it.

Targets (from the issue) are printed as met / not met; they never change the exit status. The
exit status is non-zero only when a measurement could not be made or a correctness check failed
(a duplicate ran, a denied call ran, a key executed twice under contention).
"""
from __future__ import annotations

import argparse
import datetime as dt
import fcntl
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

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

ALLOWED, APPROVED, DENIED_AMOUNT = 100, 500_000, 10**9
CALL_SCENARIOS = ("allowed", "duplicate", "denied", "approval")

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

# Variables that would point either implementation at another store or project.
SCRUBBED_ENV = ("CTRLRUN_STORE_URL", "DATABASE_URL", "CTRLRUN_STATE", "CTRLRUN_CONFIG", "CTRLRUN_ENVIRONMENT",
                "DJANGO_SETTINGS_MODULE", "PYTHONPATH", "PYTHONHOME", "REFPG_URL")


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
    return "reference" if hasattr(ctrlrun, "Control") else "ours"


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


def worker_calls(scenario: str, calls: int, rounds: int) -> dict[str, Any]:
    import ctrlrun

    executed: list[str] = []

    @ctrlrun.protect("stripe.refund", effect="refund:{payment_id}")
    def refund(payment_id: str, amount: int) -> dict:
        executed.append(payment_id)
        return {"id": f"re_{payment_id}", "amount": amount}

    clock = time.perf_counter
    grant = None
    expected_runs = 0

    def allowed(tag: str, n: int) -> float:
        nonlocal expected_runs
        start = clock()
        for i in range(n):
            refund(payment_id=f"{tag}_{i}", amount=ALLOWED)
        expected_runs += n
        return clock() - start

    def duplicate(tag: str, n: int) -> float:
        nonlocal expected_runs
        for i in range(n):  # untimed: commit the keys the timed loop then repeats
            refund(payment_id=f"{tag}_{i}", amount=ALLOWED)
        expected_runs += n
        start = clock()
        for i in range(n):
            try:
                refund(payment_id=f"{tag}_{i}", amount=ALLOWED)
            except ctrlrun.DuplicateEffect:
                pass
            else:
                raise SystemExit(f"duplicate {tag}_{i} ran twice")
        return clock() - start

    def denied(tag: str, n: int) -> float:
        start = clock()
        for i in range(n):
            try:
                refund(payment_id=f"{tag}_{i}", amount=DENIED_AMOUNT)
            except ctrlrun.ActionDenied:
                pass
            else:
                raise SystemExit(f"denied call {tag}_{i} ran")
        return clock() - start

    def approval(tag: str, n: int) -> float:
        nonlocal grant, expected_runs
        if grant is None:
            grant = _granter(ctrlrun)
        total = 0.0
        for i in range(n):
            key = f"{tag}_{i}"
            try:
                refund(payment_id=key, amount=APPROVED)
            except ctrlrun.ApprovalRequired as exc:
                request_id = exc.request_id
            else:
                raise SystemExit(f"{key}: an approve decision ran without an approval")
            grant(request_id)
            with ctrlrun.with_approval(request_id):
                start = clock()
                refund(payment_id=key, amount=APPROVED)
                total += clock() - start
            expected_runs += 1
        return total

    run = {"allowed": allowed, "duplicate": duplicate, "denied": denied, "approval": approval}[scenario]
    per_round: list[float] = []
    with ctrlrun.context(agent="bench-agent"):
        refund(payment_id="warmup", amount=1)  # configures the store (migrations) untimed
        expected_runs += 1
        run("w", max(3, min(calls, 20)))  # warm the scenario's own path, untimed
        for round_no in range(rounds):
            per_round.append(run(f"r{round_no}", calls) / calls * 1e6)
    if len(executed) != expected_runs:
        raise SystemExit(f"executed {len(executed)} calls, expected {expected_runs}")
    return {**_describe(ctrlrun), "store": _store_in_use(ctrlrun), "scenario": scenario, "calls": calls,
            "rounds": rounds, "per_round_us": per_round, "median_us": statistics.median(per_round)}


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
        Path("ctrlrun.yaml").write_text(POLICY)
    if args.worker in CALL_SCENARIOS:
        _emit(worker_calls(args.worker, args.calls, args.rounds))
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


def run_worker(impl: str, python: str, scenario: str, db: str, args: argparse.Namespace,
               databases: Databases | None) -> dict[str, Any]:
    workdir = tempfile.mkdtemp(prefix=f"ctrlrun-compare-{impl}-{scenario}-{db}-")
    env = {k: v for k, v in os.environ.items() if k not in SCRUBBED_ENV}
    url = None
    try:
        if db == "postgresql":
            assert databases is not None
            url = databases.create(f"{impl}_{scenario}")
        if impl == "ours":
            env["PYTHONPATH"] = str(REPO)
            if url:
                env["CTRLRUN_STORE_URL"] = url
        elif url:
            env["PYTHONPATH"] = args.reference_pg_shim
            env["REFPG_URL"] = url  # the shim: protect()'s default Control on PostgresStateStore
            env["CTRLRUN_STORE_URL"] = url  # the reference's CLI (the approval grant) honours this
        cmd = [python, str(HERE), "--worker", scenario, "--dir", workdir, "--timeout", str(args.timeout)]
        if scenario == "contention":
            cmd += ["--workers", str(args.workers), "--keys", str(args.keys), "--races", str(args.races)]
        else:
            calls = args.approval_calls if scenario == "approval" else args.calls
            cmd += ["--calls", str(calls), "--rounds", str(args.rounds)]
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {args.timeout:.0f}s"}
        result = next((json.loads(line[len(RESULT_MARK):]) for line in proc.stdout.splitlines()
                       if line.startswith(RESULT_MARK)), None)
        if proc.returncode or result is None:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-6:]
            return {"error": f"exit {proc.returncode}: " + " | ".join(tail)}
        # The interpreter must have imported the implementation we think it did.
        inside = Path(result["module"]).resolve().is_relative_to(REPO)
        if inside != (impl == "ours"):
            return {"error": f"{impl} run imported ctrlrun from {result['module']}"}
        if db == "postgresql" and scenario != "contention" and "postgres" not in result.get("store", "").lower():
            return {"error": f"{impl} run on PostgreSQL used store {result.get('store')!r} (shim not loaded?)"}
        return result
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


def _verdict(scenario: str, db: str, ratio: float | None) -> str:
    target = TARGETS.get((scenario, db))
    if target is None:
        return "(no target)"
    op, bound = target
    text = f"target {op} {bound:g}x: "
    if ratio is None:
        return text + "not measured"
    met = ratio <= bound if op == "<=" else ratio >= bound
    return text + ("met" if met else "NOT met")


def _sqlite_version(python: str) -> str:
    try:
        out = subprocess.run([python, "-c", "import sqlite3; print(sqlite3.sqlite_version)"], capture_output=True,
                             text=True, timeout=30)
        return out.stdout.strip() or "?"
    except Exception:
        return "?"


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
    passes: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    try:
        for pass_no in range(args.passes):
            for db in dbs:
                for n, scenario in enumerate(scenarios):
                    # Alternate who runs first, by scenario and by pass, so drift in the machine's
                    # load does not always favour the same side.
                    order = impls if (n + pass_no) % 2 == 0 else list(reversed(impls))
                    for impl, python in order:
                        if (impl == "reference" and db == "postgresql"
                                and not (Path(args.reference_pg_shim) / "sitecustomize.py").exists()):
                            result = {"error": "no PostgreSQL shim for the reference"}
                        else:
                            label = f" (pass {pass_no + 1}/{args.passes})" if args.passes > 1 else ""
                            print(f"... {scenario:10s} {db:10s} {impl}{label}", file=sys.stderr, flush=True)
                            began = time.time()
                            result = run_worker(impl, python, scenario, db, args, databases)
                            print(f"    {time.time() - began:.1f}s"
                                  + (f"  ERROR {result['error']}" if "error" in result else ""),
                                  file=sys.stderr, flush=True)
                        passes.setdefault((scenario, db, impl), []).append(result)
    finally:
        if databases is not None:
            databases.drop_all()

    results = {key: _merge(runs) for key, runs in passes.items()}
    failed = False
    if any(s != "contention" for s in scenarios):
        print()
        print(f"{'scenario':11s} {'db':11s} {'ours µs':>10s} {'reference µs':>13s} {'ratio':>7s}  target")
    for db in dbs:
        for scenario in [s for s in scenarios if s != "contention"]:
            ours, ref = results[(scenario, db, "ours")], results.get((scenario, db, "reference"), {"error": "-"})
            o = ours.get("median_us")
            r = ref.get("median_us")
            ratio = o / r if o and r else None
            failed |= "error" in ours or (len(impls) == 2 and "error" in ref)
            spread = ""
            if args.passes > 1 and "per_pass" in ours:
                spread = ("   passes: ours " + "/".join(f"{v:.0f}" for v in ours["per_pass"]) + ", ref "
                          + "/".join(f"{v:.0f}" for v in ref.get("per_pass", [])))
            print(f"{scenario:11s} {db:11s} {_num(o, ours):>10s} {_num(r, ref):>13s} "
                  f"{(f'{ratio:.2f}x' if ratio else '-'):>7s}  {_verdict(scenario, db, ratio)}{spread}")
    if "contention" in scenarios:
        print()
        print(f"{'contention':11s} {'db':11s} {'ours att/s':>10s} {'reference att/s':>16s} {'ratio':>7s}  target; "
              f"exactly once per key (ours / reference)")
        for db in dbs:
            ours = results[("contention", db, "ours")]
            ref = results.get(("contention", db, "reference"), {"error": "-"})
            o, r = ours.get("attempts_per_s"), ref.get("attempts_per_s")
            ratio = o / r if o and r else None
            failed |= "error" in ours or not ours.get("exactly_once", False)
            failed |= len(impls) == 2 and ("error" in ref or not ref.get("exactly_once", False))
            print(f"{'contention':11s} {db:11s} {_num(o, ours, 0):>10s} {_num(r, ref, 0):>16s} "
                  f"{(f'{ratio:.2f}x' if ratio else '-'):>7s}  {_verdict('contention', db, ratio)}; "
                  f"{_once(ours)} / {_once(ref)}")
        for db in dbs:
            for impl, _ in impls:
                res = results.get(("contention", db, impl), {})
                if "attempts" in res:
                    races = ", ".join(f"{r:.0f}" for r in res["per_race"])
                    print(f"  {db} {impl}: {res['races']} races of {res['workers']} workers x {res['keys']} keys "
                          f"({races} att/s); ran {res['ran']}, refused as duplicate {res['refused']}, "
                          f"other {res['other']}"
                          + (f"; e.g. {res['samples'][0]}" if res["samples"] else ""))
    errors = [(k, v["error"]) for k, v in results.items() if "error" in v]
    if errors:
        print()
        for (scenario, db, impl), error in errors:
            print(f"error: {scenario} {db} {impl}: {error}")

    ref_any = next((v for (s, d, i), v in results.items() if i == "reference" and "version" in v), {})
    ours_any = next((v for (s, d, i), v in results.items() if i == "ours" and "version" in v), {})
    print()
    print(f"date {dt.datetime.now().astimezone().isoformat(timespec='seconds')}; nproc {len(os.sched_getaffinity(0))}; "
          f"Python {platform.python_version()} (ours) / {ref_any.get('python', '-')} (reference); "
          f"SQLite {_sqlite_version(sys.executable)}"
          + (f"; PostgreSQL {pg_version}" if databases is not None else ""))
    print(f"ours: ctrlrun {ours_any.get('version', '?')} from {REPO}; reference: ctrlrun {ref_any.get('version', '-')} "
          f"via {reference if len(impls) == 2 else '(not run)'}")
    print(f"per-call: median over {args.rounds} rounds of the mean per call ({args.calls} calls/round; approval "
          f"{args.approval_calls} calls/round); contention: median of {args.races} races, "
          f"{args.workers} processes x {args.keys} keys each"
          + (f"; each the median of {args.passes} passes" if args.passes > 1 else ""))
    return 1 if failed else 0


def _merge(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One result from ``--passes`` runs: the median of the pass medians; any error wins."""
    errors = [r["error"] for r in runs if "error" in r]
    if errors:
        return {"error": errors[0]}
    if len(runs) == 1:
        return runs[0]
    merged = dict(runs[-1])
    for field in ("median_us", "attempts_per_s"):
        if field in merged:
            merged[field] = statistics.median(r[field] for r in runs)
            merged["per_pass"] = [r[field] for r in runs]
    if "per_race" in merged:
        merged["per_race"] = [x for r in runs for x in r["per_race"]]
        merged["races"] = sum(r["races"] for r in runs)
        for field in ("ran", "refused", "other", "executed_twice", "never_executed"):
            merged[field] = sum(r[field] for r in runs)
        merged["exactly_once"] = all(r["exactly_once"] for r in runs)
        merged["samples"] = [s for r in runs for s in r["samples"]][:5]
    return merged


def _num(value: float | None, result: dict[str, Any], digits: int = 1) -> str:
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
    parser.add_argument("--scenarios", default="allowed,duplicate,denied,approval,contention",
                        help="comma-separated subset (default: all five)")
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
    args = parser.parse_args()
    if args.worker:
        return worker_main(args)
    if args.approval_calls is None:
        args.approval_calls = min(args.calls, 50)
    for name in ("calls", "approval_calls", "rounds", "workers", "keys", "races", "passes"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    unknown = set(args.scenarios.split(",")) - {*CALL_SCENARIOS, "contention", ""}
    if unknown:
        parser.error(f"unknown scenario(s): {', '.join(sorted(unknown))}")
    return driver_main(args)


if __name__ == "__main__":
    sys.exit(main())
