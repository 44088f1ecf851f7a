"""The gateway mounted in a Django project's ASGI application, served by gunicorn with a uvicorn
worker (a real OS process on the test database): the MCP path is the gateway, every other path is
Django, and the calls land in the project's own store."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tests.support import REPO, executions, free_port, mcp_post, receipts, start_upstream, tools_call, wait_for_port

pytestmark = pytest.mark.slow

POLICY = 'schema: ctrlrun.policy/v2\nactions:\n  mcp.pay.refund:\n    effect: "refund:{payment_id}"\n    decision: allow\n'


def test_a_django_project_serves_the_gateway_with_gunicorn_and_uvicorn_workers(tmp_path, store_db, use_policy):
    from django.db import connection

    policy = use_policy(POLICY)
    upstream = start_upstream(tmp_path)
    (tmp_path / "site_settings.py").write_text(textwrap.dedent(f"""
        from tests.settings import *  # the tests' project, on this test's database
        DATABASES["default"]["NAME"] = {connection.settings_dict["NAME"]!r}
        CTRLRUN_POLICY = {str(policy)!r}
        ALLOWED_HOSTS = ["127.0.0.1"]
    """))
    (tmp_path / "site_asgi.py").write_text(textwrap.dedent(f"""
        import os
        os.environ["DJANGO_SETTINGS_MODULE"] = "site_settings"
        from django.core.asgi import get_asgi_application
        from ctrlrun.gateway import GatewayApp, fixed_principal, mount

        application = mount(get_asgi_application(),
                            GatewayApp(upstream={upstream.url!r}, alias="pay", principal=fixed_principal("ide-agent")),
                            hide_denied_tools=True)
    """))
    port = free_port()
    env = {"PYTHONPATH": f"{tmp_path}:{REPO}", "PATH": "/usr/bin:/bin"}
    import os

    env.update({k: v for k, v in os.environ.items() if k in ("CTRLRUN_SIGNING_KEY", "SECRET_KEY", "DATABASE_URL")})
    server = subprocess.Popen([sys.executable, "-m", "gunicorn", "site_asgi:application", "-k",
                               "uvicorn.workers.UvicornWorker", "--bind", f"127.0.0.1:{port}", "--workers", "2",
                               "-c", "/dev/null"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        wait_for_port(port, server)
        listing = {**tools_call("refund", {}), "method": "tools/list"}
        listing["params"] = {"_meta": listing["params"]["_meta"]}
        _, listed = mcp_post(f"http://127.0.0.1:{port}/mcp", listing)
        status, body = mcp_post(f"http://127.0.0.1:{port}/mcp", tools_call("refund", {"payment_id": "d1", "amount": 4}))
        again = mcp_post(f"http://127.0.0.1:{port}/mcp", tools_call("refund", {"payment_id": "d1", "amount": 4}))
        import httpx

        console = httpx.get(f"http://127.0.0.1:{port}/admin/", timeout=60)
    finally:
        server.terminate()  # the master stops its workers
        server.wait(timeout=60)
        upstream.stop()
    # mount(..., hide_denied_tools=True): the upstream's slow_refund and broken are unlisted, so left out
    assert [tool["name"] for tool in listed["result"]["tools"]] == ["refund"]
    assert status == 200 and body["result"]["_meta"]["com.ctrlrun/receipt"]["result"] == "committed"
    assert again[1]["error"]["code"] == -41004
    assert console.status_code == 302 and "/admin/login/" in console.headers["location"]  # the console, beside it
    assert [(r["action"], r["principal"]["agent"], r["result"]) for r in receipts()] == [
        ("mcp.pay.refund", "ide-agent", "committed"), ("mcp.pay.refund", "ide-agent", "blocked")]
    assert executions(upstream) == ["refund d1 4"]
