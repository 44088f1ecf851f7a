#!/usr/bin/env python3
"""A bounded soak: many protected calls from several processes against one store, with faults.

    python bench/soak.py                          # 50,000 calls, 4 processes, a fresh SQLite store
    python bench/soak.py --calls 2000             # the CI size (a few seconds)
    CTRLRUN_STORE_URL=postgresql://postgres@127.0.0.1:5432/soak python bench/soak.py --calls 20000

What runs, in a fresh folder (``--dir`` to choose it) holding ``ctrlrun.yaml``:

- ``--processes`` worker processes share ``--calls`` calls of one protected action,
  ``soak.post`` with effect key ``post:{entry_id}``. Its body acts on a *stand-in remote*: an
  append-only file (``remote.log``, one line per execution, written under ``flock``). Faults are
  injected per call: ~``--timeout-rate`` of calls act and then raise ``TimeoutError`` (the reply
  was lost: the record becomes ambiguous), ~``--lost-rate`` raise ``TimeoutError`` *before*
  acting (the request was lost: ambiguous, but the remote has nothing), ~``--not-executed-rate``
  raise ``ctrlrun.NotExecuted`` before acting (failed, a retry may run).
- ~``--retry-rate`` of calls deliberately reuse a key already used: half of them retry one of the
  worker's own faulted keys (an agent retrying after a timeout), half a random earlier key of any
  worker. They must be refused as duplicates, or run only where the record says nothing happened.
- One reconciler process runs ``ctrlrun.reconcile.run_once()`` every ``--reconcile-interval``
  seconds; the action's reconcile hook answers from the stand-in remote's record
  (``committed`` if the log holds the key, else ``not_executed``). The same hook is also asked by
  the workers themselves when a retry meets an ambiguous record (the blocking trigger). After
  the workers finish, the reconciler makes final passes until nothing is left to ask.

At the end it checks, and exits non-zero if any check fails:

1. no effect of this run is held (``reserved``/``executing``): each is ``committed``, ``failed`` or
   ``ambiguous`` (the counts are printed);
2. zero duplicate executions: no key appears twice in ``remote.log``; a ``committed`` record was
   executed exactly once, a ``failed`` one never; no execution lacks an effect record;
3. every call left exactly one receipt (refusals included), and the receipt chain verifies
   (``ctrlrun.store.verify().ok``);
4. every call ended in an outcome the workers expected (no unexpected exception).

It reports the peak RSS (``VmHWM``) of every process at 20% and 100% of its calls (10k and 50k
calls at the default size). Progress goes to stderr about every 10%.

The ``ctrlrun`` imported is this repository's (its root is put first on the path). The store is
the embedded default (SQLite at ``.ctrlrun/state.db`` in the folder) unless ``CTRLRUN_STORE_URL``
or ``DATABASE_URL`` is set; keys carry a per-run prefix, so a shared database is fine.
"""
from __future__ import annotations

import argparse
import fcntl
import json
import os
import platform
import random
import resource
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
REPO = HERE.parent.parent
ACTION = "soak.post"
POLICY = f"""\
schema: ctrlrun.policy/v2

actions:
  {ACTION}:
    effect: "post:{{entry_id}}"
    decision: allow
"""


# --------------------------------------------------------------------------- the stand-in remote


class Remote:
    """A remote service whose only memory is an append-only log of what it executed.

    Writers append one whole line under an exclusive ``flock``. The reconcile hook asks whether
    a key is in the log by scanning it in fixed-size chunks under a shared lock: nothing is
    cached, so the hook adds no memory of its own to the peak RSS the soak reports.
    """

    CHUNK = 1 << 16

    def __init__(self, path: Path, lie: bool = False) -> None:
        self.path = path
        self.lie = lie  # --break-hook: always answer not_executed (the soak must then fail)

    def act(self, entry_id: str, who: str) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.write(fd, f"{entry_id} {who}\n".encode())
        finally:
            os.close(fd)  # closing releases the lock

    def executed(self, entry_id: str) -> bool:
        needle = b"\n" + entry_id.encode() + b" "
        try:
            handle = open(self.path, "rb")
        except FileNotFoundError:
            return False
        with handle:
            fcntl.flock(handle, fcntl.LOCK_SH)
            tail = b"\n"  # the log's first line has no newline before it
            while chunk := handle.read(self.CHUNK):
                if needle in tail + chunk:
                    return True
                tail = chunk[-len(needle):]
        return False

    def answer(self, effect_key: str) -> str:
        """The reconcile hook: ask the remote whether it acted for this key."""
        if self.lie:
            return "not_executed"
        return "committed" if self.executed(effect_key.removeprefix("post:")) else "not_executed"

    def counts(self) -> Counter[str]:
        with open(self.path) as handle:
            fcntl.flock(handle, fcntl.LOCK_SH)
            return Counter(line.split(" ", 1)[0] for line in handle if line.strip())


def make_action(ctrlrun: Any, remote: Remote, who: str, fault: dict[str, str | None]) -> Any:
    """The protected function; defining it registers the reconcile hook under ``soak.post``."""

    @ctrlrun.protect(ACTION, effect="post:{entry_id}", reconcile=remote.answer)
    def post(entry_id: str, amount: int) -> dict:
        kind = fault["kind"]
        if kind == "not_executed":
            raise ctrlrun.NotExecuted("the remote refused the request before acting (injected)")
        if kind == "lost":
            raise TimeoutError("the request was lost before it reached the remote (injected)")
        remote.act(entry_id, who)
        if kind == "timeout":
            raise TimeoutError("no reply after the remote acted (injected)")
        return {"id": f"ok_{entry_id}", "amount": amount}

    return post


# --------------------------------------------------------------------------- measurements


def memory() -> dict[str, int]:
    """Peak and current resident set of this process, in kB."""
    values = {"ru_maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith(("VmHWM:", "VmRSS:")):
                    name, value = line.split(":", 1)
                    values[name] = int(value.split()[0])
    except OSError:
        pass
    values.setdefault("VmHWM", values["ru_maxrss_kb"])
    return values


def write_json(path: Path, payload: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(payload))
    os.replace(tmp, path)


# --------------------------------------------------------------------------- roles


def role_setup() -> int:
    import ctrlrun

    ctrlrun.setup()  # creates and migrates the store once, before the crowd
    return 0


def role_worker(args: argparse.Namespace) -> int:
    import ctrlrun

    here = Path.cwd()
    index, run = args.index, args.run
    share = args.calls // args.processes + (1 if index < args.calls % args.processes else 0)
    rng = random.Random(f"{args.seed}-{index}")
    remote = Remote(here / "remote.log", lie=args.break_hook)
    fault: dict[str, str | None] = {"kind": None}
    post = make_action(ctrlrun, remote, f"w{index}", fault)
    parent = os.getppid()

    outcomes: Counter[str] = Counter()
    unexpected: list[str] = []
    faulted: list[str] = []  # own keys whose call was injected with a fault: retried later
    checkpoints: dict[str, Any] = {}
    at_20 = max(1, (share * 20 + 99) // 100)
    progress_every = max(1, share // 200)
    t0 = time.time()
    with ctrlrun.context(agent=f"soak-worker-{index}"):
        for i in range(share):
            entry_id = f"{run}-{index}-{i}"
            if i and rng.random() < args.retry_rate:
                if faulted and rng.random() < 0.5:
                    entry_id = faulted.pop(rng.randrange(len(faulted)))
                    kind = "retry_faulted"
                else:
                    entry_id = f"{run}-{rng.randrange(args.processes)}-{rng.randrange(i)}"
                    kind = "retry_random"
            else:
                kind = "fresh"
            outcomes[f"key:{kind}"] += 1
            r = rng.random()
            if r < args.not_executed_rate:
                fault["kind"] = "not_executed"
            elif r < args.not_executed_rate + args.lost_rate:
                fault["kind"] = "lost"
            elif r < args.not_executed_rate + args.lost_rate + args.timeout_rate:
                fault["kind"] = "timeout"
            else:
                fault["kind"] = None
            try:
                post(entry_id=entry_id, amount=100 + i % 50)
                outcomes["ran:committed"] += 1
            except ctrlrun.NotExecuted:
                outcomes["ran:not_executed"] += 1
                faulted.append(entry_id)
            except TimeoutError:
                outcomes[f"ran:{fault['kind']}"] += 1
                faulted.append(entry_id)
            except ctrlrun.DuplicateEffect as exc:
                outcomes[f"refused:duplicate_{exc.state}"] += 1
            except ctrlrun.AmbiguousEffect:
                outcomes["refused:ambiguous"] += 1
            except ctrlrun.StoreUnavailable as exc:
                outcomes["error:store_unavailable"] += 1
                if len(unexpected) < 5:
                    unexpected.append(f"{entry_id}: StoreUnavailable: {exc}"[:400])
            except Exception as exc:
                outcomes[f"error:{type(exc).__name__}"] += 1
                if len(unexpected) < 5:
                    unexpected.append(f"{entry_id}: {type(exc).__name__}: {exc}"[:400])
            done = i + 1
            if done == at_20:
                checkpoints["20%"] = {"calls": done, **memory()}
            if done % progress_every == 0 or done == share:
                write_json(here / f"progress-{index}.json", {"done": done})
                if os.getppid() != parent:
                    print(f"worker {index}: the soak driver went away; stopping", file=sys.stderr)
                    return 3
    checkpoints["100%"] = {"calls": share, **memory()}
    write_json(here / f"result-worker-{index}.json", {
        "index": index, "calls": share, "seconds": time.time() - t0, "outcomes": outcomes,
        "unexpected": unexpected, "memory": checkpoints,
    })
    return 0


def role_reconciler(args: argparse.Namespace) -> int:
    import ctrlrun

    ctrlrun.setup()  # ctrlrun.reconcile needs the configured store to import
    import ctrlrun.reconcile

    here = Path.cwd()
    remote = Remote(here / "remote.log", lie=args.break_hook)
    make_action(ctrlrun, remote, "reconciler", {"kind": None})  # registers the hook
    stop = here / "stop"
    totals: Counter[str] = Counter()
    passes = 0
    errors: list[str] = []
    peak_pass: dict[str, Any] = {}

    def one_pass() -> int:
        nonlocal passes
        started = time.time()
        try:
            report = ctrlrun.reconcile.run_once()
        except Exception as exc:  # a failed pass is reported, and the next one tries again
            totals["pass_error"] += 1
            if len(errors) < 5:
                errors.append(f"{type(exc).__name__}: {exc}"[:400])
            return -1
        passes += 1
        totals["swept"] += len(report.swept)
        for line in report.lines:
            totals[line.outcome] += 1
            if line.outcome in ("error", "needs_human") and len(errors) < 5:
                errors.append(f"{line.effect_key}: {line.outcome}: {line.detail}"[:400])
        took = time.time() - started
        if took > peak_pass.get("seconds", 0):
            peak_pass.update(seconds=round(took, 3), asked=len(report.lines))
        return len(report.lines) + len(report.swept)

    next_at = time.time() + args.reconcile_interval
    while not stop.exists():
        if time.time() >= next_at:
            one_pass()
            next_at = time.time() + args.reconcile_interval
        time.sleep(0.05)
    final = 0
    for final in range(1, 11):  # drain: until a pass finds nothing to ask
        if one_pass() == 0:
            break
    write_json(here / "result-reconciler.json", {
        "passes": passes, "final_passes": final, "totals": totals, "errors": errors, "slowest_pass": peak_pass,
        "memory": memory(),
    })
    return 0


# --------------------------------------------------------------------------- driver


def progress_total(here: Path, processes: int) -> int:
    total = 0
    for n in range(processes):
        try:
            total += json.loads((here / f"progress-{n}.json").read_text())["done"]
        except (OSError, ValueError):
            pass
    return total


def driver(args: argparse.Namespace) -> int:
    here = Path(args.dir).absolute() if args.dir else Path(tempfile.mkdtemp(prefix="ctrlrun-soak-"))
    here.mkdir(parents=True, exist_ok=True)
    if any(here.iterdir()):
        print(f"error: {here} is not empty; the soak needs a fresh folder", file=sys.stderr)
        return 2
    (here / "ctrlrun.yaml").write_text(POLICY)
    (here / "remote.log").touch()
    run = args.run or f"s{secrets.token_hex(3)}"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    for name in ("CTRLRUN_CONFIG", "CTRLRUN_STATE", "DJANGO_SETTINGS_MODULE"):
        env.pop(name, None)  # the policy and the SQLite store are the ones in the fresh folder
    url = env.get("CTRLRUN_STORE_URL") or env.get("DATABASE_URL")
    where = f"{url.split('@')[-1]}" if url else f"SQLite {here / '.ctrlrun' / 'state.db'}"
    print(f"[soak] {args.calls} calls, {args.processes} processes, store {where}, folder {here}, run {run}",
          file=sys.stderr)

    base = [sys.executable, str(HERE), "--dir", str(here), "--run", run, "--calls", str(args.calls),
            "--processes", str(args.processes), "--seed", str(args.seed), "--retry-rate", str(args.retry_rate),
            "--timeout-rate", str(args.timeout_rate), "--lost-rate", str(args.lost_rate),
            "--not-executed-rate", str(args.not_executed_rate),
            "--reconcile-interval", str(args.reconcile_interval)] + (["--break-hook"] if args.break_hook else [])
    setup = subprocess.run([*base, "--role", "setup"], env=env, cwd=here, capture_output=True, text=True)
    if setup.returncode:
        print(f"error: the store could not be created:\n{setup.stderr[-3000:]}", file=sys.stderr)
        return 2

    started = time.time()
    reconciler = subprocess.Popen([*base, "--role", "reconciler"], env=env, cwd=here)
    workers = [subprocess.Popen([*base, "--role", "worker", "--index", str(n)], env=env, cwd=here)
               for n in range(args.processes)]
    failures: list[str] = []
    next_tenth = 1
    try:
        while any(w.poll() is None for w in workers):
            time.sleep(0.2)
            done = progress_total(here, args.processes)
            while next_tenth <= 10 and done * 10 >= next_tenth * args.calls:
                elapsed = time.time() - started
                print(f"[soak] {next_tenth * 10:3d}%  {done}/{args.calls} calls  {elapsed:6.1f}s  "
                      f"{done / max(elapsed, 1e-9):7.0f} calls/s", file=sys.stderr, flush=True)
                next_tenth += 1
            if time.time() - started > args.max_seconds:
                failures.append(f"the soak did not finish within --max-seconds {args.max_seconds:g}")
                break
            if any(w.returncode for w in workers if w.poll() is not None):
                break
        for n, w in enumerate(workers):
            if w.poll() is None:
                w.kill()
                w.wait()
            if w.returncode:
                failures.append(f"worker {n} exited {w.returncode}")
        calls_seconds = time.time() - started
        (here / "stop").touch()
        try:
            reconciler.wait(timeout=max(60.0, args.max_seconds / 4))
        except subprocess.TimeoutExpired:
            failures.append("the reconciler did not finish its final passes")
        if reconciler.returncode:
            failures.append(f"the reconciler exited {reconciler.returncode}")
    finally:
        for p in [*workers, reconciler]:
            if p.poll() is None:
                p.kill()
                p.wait()
    total_seconds = time.time() - started

    ok = check(args, here, run, calls_seconds, total_seconds, failures)
    if args.keep or not ok:
        print(f"[soak] folder kept: {here}", file=sys.stderr)
    elif not args.dir:
        shutil.rmtree(here, ignore_errors=True)
    return 0 if ok else 1


def check(args: argparse.Namespace, here: Path, run: str, calls_seconds: float, total_seconds: float,
          failures: list[str]) -> bool:
    results = []
    for n in range(args.processes):
        path = here / f"result-worker-{n}.json"
        if path.exists():
            results.append(json.loads(path.read_text()))
        else:
            failures.append(f"worker {n} left no result")
    rec_path = here / "result-reconciler.json"
    reconciler = json.loads(rec_path.read_text()) if rec_path.exists() else None

    outcomes: Counter[str] = Counter()
    for r in results:
        outcomes.update(r["outcomes"])
    calls_made = sum(v for k, v in outcomes.items() if not k.startswith("key:"))
    unexpected = sum(v for k, v in outcomes.items() if k.startswith("error:"))

    # The store, read in this process (after every worker has exited).
    os.chdir(here)
    sys.path.insert(0, str(REPO))
    import ctrlrun
    import ctrlrun.standalone

    ctrlrun.setup()
    from django.db.models import Count

    from ctrlrun import conf, store
    from ctrlrun.models import Receipt

    prefix = f"post:{run}-"
    effects = {e.effect_key: e for e in store.list_effects() if e.effect_key.startswith(prefix)}
    states = Counter(e.state for e in effects.values())
    held = sorted(k for k, e in effects.items() if e.state in ("reserved", "executing"))
    executions = Remote(here / "remote.log").counts()
    twice = {k: c for k, c in executions.items() if c > 1}
    committed_not_once = sorted(k for k, e in effects.items()
                                if e.state == "committed" and executions.get(k.removeprefix("post:"), 0) != 1)
    failed_but_ran = sorted(k for k, e in effects.items()
                            if e.state == "failed" and executions.get(k.removeprefix("post:"), 0) != 0)
    unrecorded = sorted(k for k in executions if f"post:{k}" not in effects)
    receipts = Receipt.objects.using(conf.database_alias()).filter(effect_key__startswith=prefix)
    receipt_count = receipts.count()
    by_result = dict(receipts.values_list("result").annotate(n=Count("pk")).order_by())
    t = time.time()
    chain = store.verify()
    verify_seconds = time.time() - t

    print()
    print(f"soak: {args.calls} calls, {args.processes} processes, store {ctrlrun.standalone.describe_store()}")
    print(f"  calls took {calls_seconds:.1f}s ({args.calls / max(calls_seconds, 1e-9):.0f} calls/s); "
          f"with final reconcile {total_seconds:.1f}s")
    keys = {k.removeprefix("key:"): v for k, v in outcomes.items() if k.startswith("key:")}
    print(f"  keys used: {keys}")
    print(f"  outcomes: {dict(sorted((k, v) for k, v in outcomes.items() if not k.startswith('key:')))}")
    if reconciler:
        print(f"  reconciler: {reconciler['passes']} passes ({reconciler['final_passes']} final), "
              f"{dict(reconciler['totals'])}, slowest pass {reconciler['slowest_pass']}")
        if reconciler["totals"].get("unknown"):
            print("    (this hook never answers unknown: each 'unknown' above is an answer dropped because a "
                  "worker's own reconcile had moved the record first; ctrlrun.reconcile reports those as unknown)")
        for line in reconciler["errors"]:
            print(f"    {line}")
    print(f"  effects of this run: {len(effects)}: {dict(sorted(states.items()))}")
    print(f"  remote executions: {sum(executions.values())} over {len(executions)} keys")
    print(f"  receipts for this run's keys: {receipt_count} {dict(sorted(by_result.items()))}")
    print(f"  chain: {chain.verified} verified, {chain.chained} chained, head seq {chain.head_seq}, "
          f"{len(chain.breaks)} break(s) ({verify_seconds:.1f}s)")

    print("  peak RSS (VmHWM, MB) per process at 20% / 100% of its calls:")
    for r in sorted(results, key=lambda r: r["index"]):
        m20, m100 = r["memory"].get("20%", {}), r["memory"]["100%"]
        growth = m100["VmHWM"] - m20.get("VmHWM", m100["VmHWM"])
        print(f"    worker {r['index']}: {m20.get('VmHWM', 0) / 1024:6.1f} at {m20.get('calls', 0)} calls / "
              f"{m100['VmHWM'] / 1024:6.1f} at {m100['calls']} calls  (+{growth / 1024:.1f} MB; "
              f"{r['calls'] / max(r['seconds'], 1e-9):.0f} calls/s)")
        for line in r["unexpected"]:
            print(f"      unexpected: {line}")
    if reconciler:
        print(f"    reconciler: {reconciler['memory']['VmHWM'] / 1024:6.1f} at the end")

    checks = [
        ("every worker finished", not failures, "; ".join(failures)),
        (f"all {args.calls} calls accounted for", calls_made == args.calls, f"{calls_made} recorded by workers"),
        ("no unexpected exception", unexpected == 0, f"{unexpected} call(s) raised something unexpected"),
        ("no effect held (each committed / failed / ambiguous)", not held,
         f"{len(held)} held, e.g. {held[:5]}"),
        ("zero duplicate executions", not twice, f"{len(twice)} keys executed more than once, e.g. "
                                                 f"{sorted(twice.items())[:5]}"),
        ("committed => executed exactly once", not committed_not_once, f"e.g. {committed_not_once[:5]}"),
        ("failed => never executed", not failed_but_ran, f"e.g. {failed_but_ran[:5]}"),
        ("every execution has its effect record", not unrecorded, f"e.g. {unrecorded[:5]}"),
        ("one receipt per call", receipt_count == args.calls, f"{receipt_count} receipts for {args.calls} calls"),
        ("receipt chain verifies", chain.ok, f"breaks: {[b.as_dict() for b in chain.breaks[:3]]}"),
    ]
    ok = True
    print()
    for name, passed, detail in checks:
        print(f"  {'PASS' if passed else 'FAIL'}  {name}" + ("" if passed else f": {detail}"))
        ok &= passed
    if states.get("ambiguous"):
        print(f"  note: {states['ambiguous']} effect(s) left ambiguous after the final reconcile passes")
    print(f"  python {platform.python_version()}, nproc {len(os.sched_getaffinity(0))}")
    print("soak: " + ("OK" if ok else "FAILED"))
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=50_000, help="protected calls in all (default 50,000)")
    parser.add_argument("--processes", type=int, default=4, help="worker processes (default 4)")
    parser.add_argument("--dir", help="the (empty) folder to run in; default a fresh temporary one")
    parser.add_argument("--timeout-rate", type=float, default=0.02, help="act, then raise TimeoutError")
    parser.add_argument("--lost-rate", type=float, default=0.005, help="raise TimeoutError without acting")
    parser.add_argument("--not-executed-rate", type=float, default=0.01, help="raise ctrlrun.NotExecuted")
    parser.add_argument("--retry-rate", type=float, default=0.05, help="calls that reuse an earlier key")
    parser.add_argument("--reconcile-interval", type=float, default=2.0, help="seconds between reconcile passes")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--max-seconds", type=float, default=3600, help="give up (and fail) after this long")
    parser.add_argument("--break-hook", action="store_true",
                        help="check the checks: the reconcile hook always answers not_executed, so retries of "
                             "lost replies run twice and the soak must FAIL")
    parser.add_argument("--keep", action="store_true", help="keep the folder (it is always kept on failure)")
    parser.add_argument("--role", choices=["setup", "worker", "reconciler"], help=argparse.SUPPRESS)
    parser.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--run", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.calls < 1 or args.processes < 1:
        parser.error("--calls and --processes must be at least 1")
    if args.role:
        sys.path.insert(0, str(REPO))
        os.chdir(args.dir)
        return {"setup": lambda: role_setup(), "worker": lambda: role_worker(args),
                "reconciler": lambda: role_reconciler(args)}[args.role]()
    return driver(args)


if __name__ == "__main__":
    sys.exit(main())
