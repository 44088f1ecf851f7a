#!/usr/bin/env python3
"""An allowed ``tools/call`` through the MCP gateway, beside the same protected call made directly
(``Control.acall``) and beside the upstream called directly without ctrlrun: calls/s and per-call
latency, interleaved in blocks in one run.

    python bench/gateway_throughput.py                         # SQLite
    python bench/gateway_throughput.py --db postgresql         # a scratch database on --pg-url
    python bench/gateway_throughput.py --db both --block 25 --blocks 12

For each database, in a fresh folder (its SQLite store; on PostgreSQL a scratch database this
script creates on the server of ``--pg-url`` and drops afterwards):

- the upstream is an MCP server built with the ``mcp`` SDK (``MCPServer``, Streamable HTTP, uvicorn)
  in a process of its own, with one tool ``note(n)`` that returns ``n``;
- a worker process (standalone ctrlrun on that store) starts ``ctrlrun gateway --alias bench
  --principal bench`` in front of it (another process, the same store), then runs, round after
  round, one block of ``--block`` calls of each way (the order rotating each round, so a burst of
  load on the machine falls on every way alike):

  - ``upstream``: a JSON-RPC ``tools/call`` POSTed to the upstream (one keep-alive httpx client);
  - ``acall``: ``Control.acall("mcp.bench.note", {"n": key}, executor)`` whose executor POSTs the
    same request to the upstream (one keep-alive client): the kernel's decision, effect key,
    events and receipt around the same exchange;
  - ``gateway``: the ``tools/call`` POSTed to the gateway (one keep-alive client); the gateway
    makes the protected call and reaches the upstream on a fresh connection per call (by design:
    "never connected" is then provable).

  Every call has a fresh effect key (``note:{n}``, allowed); every answer is checked (a
  committed receipt for ``acall`` and ``gateway``). Calls are one after another (one in flight).

It prints a Markdown table: per (way, db) calls/s (calls / the blocks' wall time), mean, p50, p90
and p99 latency in µs, and each way's mean over the upstream's. ``--json`` prints the numbers too.
Nothing is asserted about speed.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
POLICY = """\
schema: ctrlrun.policy/v2
actions:
  mcp.bench.note:
    effect: "note:{n}"
    decision: allow
"""
WAYS = ("upstream", "acall", "gateway")
REVISION = "2026-07-28"
RESULT_MARK = "@@gateway-throughput "
SCRUBBED_PREFIXES = ("CTRLRUN_", "DJANGO_")
SCRUBBED = ("DATABASE_URL", "PYTHONPATH")


# --------------------------------------------------------------------------- the upstream

def serve_upstream(port: int) -> None:
    import uvicorn
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("bench-upstream")

    @server.tool()
    def note(n: str) -> str:
        """Return n."""
        return n

    uvicorn.run(server.streamable_http_app(), host="127.0.0.1", port=port, log_level="warning")


# --------------------------------------------------------------------------- the worker

def _message(request_id: int, key: str) -> tuple[bytes, dict[str, str]]:
    meta = {"io.modelcontextprotocol/protocolVersion": REVISION,
            "io.modelcontextprotocol/clientInfo": {"name": "bench", "version": "1"},
            "io.modelcontextprotocol/clientCapabilities": {}}
    body = {"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
            "params": {"name": "note", "arguments": {"n": key}, "_meta": meta}}
    headers = {"content-type": "application/json", "accept": "application/json, text/event-stream",
               "mcp-protocol-version": REVISION, "mcp-method": "tools/call", "mcp-name": "note"}
    return json.dumps(body).encode(), headers


def _answer(response) -> dict:
    """The JSON-RPC response of a JSON or SSE body."""
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        data = [line[5:].strip() for line in response.text.splitlines() if line.startswith("data:")]
        return json.loads(data[-1])
    return response.json()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_for(port: int, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"a bench process exited {proc.returncode}: "
                             f"{proc.stderr.read()[-2000:] if proc.stderr else ''}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"nothing listens on 127.0.0.1:{port}")


def worker(upstream_port: int, block: int, blocks: int, warmup: int) -> dict:
    from ctrlrun import standalone

    standalone.ensure_ready()  # the store is migrated before the gateway opens it
    from ctrlrun.control import Control

    control = Control.from_file(os.environ["CTRLRUN_CONFIG"])
    upstream = f"http://127.0.0.1:{upstream_port}/mcp"
    port = _free_port()
    gateway = subprocess.Popen([sys.executable, "-m", "ctrlrun", "gateway", "--upstream", upstream, "--alias", "bench",
                                "--principal", "bench", "--listen", f"127.0.0.1:{port}"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(port, gateway)
        return asyncio.run(_measure(control, upstream, f"http://127.0.0.1:{port}/mcp", block, blocks, warmup))
    finally:
        gateway.kill()
        gateway.wait(timeout=30)


async def _measure(control, upstream: str, gateway: str, block: int, blocks: int, warmup: int) -> dict:
    import httpx

    counter = iter(range(1, 10**9))
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    async with httpx.AsyncClient(timeout=60, limits=limits, trust_env=False) as to_upstream, \
            httpx.AsyncClient(timeout=60, limits=limits, trust_env=False) as to_executor, \
            httpx.AsyncClient(timeout=60, limits=limits, trust_env=False) as to_gateway:

        async def direct() -> None:
            n = next(counter)
            body, headers = _message(n, f"u{n}")
            answer = _answer(await to_upstream.post(upstream, content=body, headers=headers))
            assert answer["result"].get("isError") is not True, answer

        async def acall() -> None:
            n = next(counter)
            body, headers = _message(n, f"a{n}")

            async def executor() -> dict:
                answer = _answer(await to_executor.post(upstream, content=body, headers=headers))
                assert answer["result"].get("isError") is not True, answer
                return answer["result"]

            await control.acall("mcp.bench.note", {"n": f"a{n}"}, executor, principal="bench")

        async def through() -> None:
            n = next(counter)
            body, headers = _message(n, f"g{n}")
            answer = _answer(await to_gateway.post(gateway, content=body, headers=headers))
            assert answer["result"]["_meta"]["com.ctrlrun/receipt"]["result"] == "committed", answer

        ways = {"upstream": direct, "acall": acall, "gateway": through}
        for call in ways.values():  # connections, the policy's row, the SDK's first answers
            for _ in range(warmup):
                await call()
        latencies: dict[str, list[float]] = {way: [] for way in WAYS}
        wall = dict.fromkeys(WAYS, 0.0)
        for round_ in range(blocks):
            order = WAYS[round_ % len(WAYS):] + WAYS[:round_ % len(WAYS)]
            for way in order:
                call, times = ways[way], latencies[way]
                began = time.perf_counter()
                for _ in range(block):
                    started = time.perf_counter()
                    await call()
                    times.append(time.perf_counter() - started)
                wall[way] += time.perf_counter() - began
    result = {}
    for way in WAYS:
        times = sorted(latencies[way])

        def at(q: float) -> float:
            return times[min(len(times) - 1, int(q * len(times)))] * 1e6

        result[way] = {"calls": len(times), "calls_per_s": len(times) / wall[way],
                       "mean_us": statistics.fmean(times) * 1e6, "p50_us": at(0.5), "p90_us": at(0.9),
                       "p99_us": at(0.99)}
    return result


# --------------------------------------------------------------------------- the run

def _pg_database(url: str, name: str, create: bool) -> str:
    """Drop (and with ``create`` make again) the scratch database ``name``; the server's version."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        if create:
            conn.execute(f'CREATE DATABASE "{name}"')
        return conn.execute("SHOW server_version").fetchone()[0]


def run_db(db: str, args: argparse.Namespace) -> dict:
    folder = Path(tempfile.mkdtemp(prefix=f"ctrlrun-bench-gateway-{db}-"))
    (folder / "ctrlrun.yaml").write_text(POLICY)
    env = {k: v for k, v in os.environ.items() if not k.startswith(SCRUBBED_PREFIXES) and k not in SCRUBBED}
    env.update(PYTHONPATH=str(REPO), CTRLRUN_CONFIG=str(folder / "ctrlrun.yaml"),
               CTRLRUN_SIGNING_KEY="bench-only-signing-key-0123456789abcdef")
    scratch = None
    if db == "postgresql":
        scratch = f"ctrlrun_bench_gateway_{os.getpid()}"
        args.pg_version = _pg_database(args.pg_url, scratch, create=True)
        env["CTRLRUN_STORE_URL"] = args.pg_url.rsplit("/", 1)[0] + "/" + scratch
    else:
        env["CTRLRUN_STATE"] = str(folder / "state.db")
    port = _free_port()
    upstream = subprocess.Popen([sys.executable, __file__, "--serve-upstream", str(port)], cwd=folder, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(port, upstream)
        done = subprocess.run([sys.executable, __file__, "--worker", str(port), "--block", str(args.block),
                               "--blocks", str(args.blocks), "--warmup", str(args.warmup)],
                              cwd=folder, env=env, capture_output=True, text=True)
        lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT_MARK)]
        if done.returncode != 0 or len(lines) != 1:
            raise SystemExit(f"the {db} worker failed:\n{done.stderr[-3000:]}")
        return json.loads(lines[0][len(RESULT_MARK):])
    finally:
        upstream.kill()
        upstream.wait(timeout=30)
        if scratch:
            _pg_database(args.pg_url, scratch, create=False)


def table(results: dict[str, dict]) -> str:
    rows = ["| way | db | calls | calls/s | mean µs | p50 µs | p90 µs | p99 µs | mean / upstream's |",
            "|---|---|--:|--:|--:|--:|--:|--:|--:|"]
    for db, measured in results.items():
        base = measured["upstream"]["mean_us"]
        for way in WAYS:
            m = measured[way]
            rows.append(f"| {way} | {db} | {m['calls']} | {m['calls_per_s']:.0f} | {m['mean_us']:.0f} | "
                        f"{m['p50_us']:.0f} | {m['p90_us']:.0f} | {m['p99_us']:.0f} | {m['mean_us'] / base:.2f} |")
    return "\n".join(rows)


def machine(pg_version: str | None) -> str:
    import sqlite3

    postgresql = f", PostgreSQL {pg_version}" if pg_version else ""
    return (f"Python {platform.python_version()}, SQLite {sqlite3.sqlite_version}{postgresql}, {os.cpu_count()} "
            f"CPUs, {platform.system()} {platform.release()}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", choices=["sqlite", "postgresql", "both"], default="sqlite")
    parser.add_argument("--pg-url", default=os.environ.get("BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres"),
                        help="the PostgreSQL server (a database on it to connect to) for --db postgresql")
    parser.add_argument("--block", type=int, default=25, help="calls per block of each way")
    parser.add_argument("--blocks", type=int, default=12, help="rounds: one block of each way per round")
    parser.add_argument("--warmup", type=int, default=10, help="calls of each way before the timed rounds")
    parser.add_argument("--json", action="store_true", help="print the numbers as JSON after the table")
    parser.add_argument("--worker", type=int, metavar="UPSTREAM_PORT", help=argparse.SUPPRESS)
    parser.add_argument("--serve-upstream", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if min(args.block, args.blocks) < 1 or args.warmup < 0:
        parser.error("--block and --blocks must be at least 1, --warmup 0 or more")
    if args.serve_upstream:
        serve_upstream(args.serve_upstream)
        return 0
    if args.worker:
        print(RESULT_MARK + json.dumps(worker(args.worker, args.block, args.blocks, args.warmup)), flush=True)
        return 0
    args.pg_version = None
    results = {db: run_db(db, args) for db in (("sqlite", "postgresql") if args.db == "both" else (args.db,))}
    print(table(results))
    print()
    print(f"{args.blocks} rounds of {args.block} calls per way, interleaved; {machine(args.pg_version)}")
    if args.json:
        print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
