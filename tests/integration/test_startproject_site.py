"""A fresh ``django-admin startproject`` site served under a real gunicorn (issue 25, item 8), as the
README says to serve one's own project: its settings lines for ctrlrun and for static files (the
whitenoise middleware, ``STATIC_ROOT``) appended as written, ``migrate``, ``collectstatic`` and
``gunicorn mysite.wsgi`` run as the README writes them (parsed from it: tests/support/
StartprojectSite), on a loopback port. A person logged in through the real login form gets the
admin's CSS and ctrlrun's stylesheets with 200, with DEBUG on (startproject's default) and off."""
from __future__ import annotations

import http.cookiejar
import re
import shlex
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.support import PASSWORD, StartprojectSite

pytestmark = pytest.mark.slow

GUNICORN = Path(sys.executable).with_name("gunicorn")
POLICY = """\
schema: ctrlrun.policy/v2
actions:
  stripe.refund:
    effect: "refund:{payment_id}"
    decision: allow
"""
SETUP = f"""
import ctrlrun
from django.contrib.auth import get_user_model

get_user_model().objects.create_superuser("root", "root@example.com", {PASSWORD!r})


@ctrlrun.protect("stripe.refund", effect="refund:{{payment_id}}")
def refund(payment_id, amount):
    return {{"id": "re_" + payment_id}}


with ctrlrun.context(agent="support-agent"):
    refund(payment_id="txn_1", amount=100)
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def command(line: str, port: int) -> list[str]:
    """A README command as this machine runs it: this venv's python and gunicorn, a free loopback port."""
    words = shlex.split(line.replace("127.0.0.1:8000", f"127.0.0.1:{port}"))
    programs = {"python": sys.executable, "gunicorn": str(GUNICORN)}
    return [programs.get(words[0], words[0]), *words[1:]]


class Browser:
    """A person with cookies, over HTTP: the login form, then pages and the files they link."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))

    def get(self, path: str) -> tuple[int, str]:
        with self.opener.open(self.base + path, timeout=30) as reply:
            return reply.status, reply.read().decode()

    def login(self) -> None:
        _, form = self.get("/admin/login/?next=/admin/")
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form).group(1)
        data = urllib.parse.urlencode({"csrfmiddlewaretoken": token, "username": "root", "password": PASSWORD,
                                       "next": "/admin/"}).encode()
        request = urllib.request.Request(self.base + "/admin/login/?next=/admin/", data=data,
                                         headers={"Referer": self.base + "/admin/login/"})
        with self.opener.open(request, timeout=30) as reply:
            assert reply.url.endswith("/admin/") and "Log out" in reply.read().decode(), reply.url


def stylesheets(html: str) -> list[str]:
    return re.findall(r'<link rel="stylesheet" href="([^"]+)"', html)


def serve(site: StartprojectSite, line: str, port: int) -> subprocess.Popen:
    server = subprocess.Popen(command(line, port), cwd=site.folder, env=site.env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 90
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/admin/login/", timeout=5):
                return server
        except OSError:
            if server.poll() is not None:
                raise AssertionError(f"gunicorn exited: {server.stderr.read()[-3000:]}") from None
            if time.monotonic() > deadline:
                server.terminate()
                raise
            time.sleep(0.3)


@pytest.fixture
def site(tmp_path):
    site = StartprojectSite(tmp_path, policy=POLICY, serving=True)
    assert site.recipe["serving"], "the README says nothing of serving one's project under gunicorn"
    assert "whitenoise.middleware.WhiteNoiseMiddleware" in site.recipe["serving"]
    assert "STATIC_ROOT" in site.recipe["serving"]
    migrated = site.manage("migrate")
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    made = site.shell(SETUP)
    assert made.returncode == 0, made.stdout + made.stderr
    return site


@pytest.mark.parametrize("debug", [True, False])
def test_the_readme_serves_a_startproject_site_under_gunicorn_with_its_css(site, debug):
    commands = site.recipe["commands"]
    assert [c.split()[:3] for c in commands] == [["python", "manage.py", "collectstatic"], ["gunicorn", "mysite.wsgi",
                                                                                          "--bind"]], commands
    if not debug:  # as in production: DEBUG off, the host named
        settings = site.folder / "mysite" / "settings.py"
        settings.write_text(settings.read_text() + '\nDEBUG = False\nALLOWED_HOSTS = ["127.0.0.1"]\n')
    collected = subprocess.run(command(commands[0], 0), cwd=site.folder, env=site.env, capture_output=True,
                               text=True, timeout=300)
    assert collected.returncode == 0, collected.stdout + collected.stderr
    assert (site.folder / "staticfiles" / "ctrlrun" / "console.css").exists()

    port = free_port()
    server = serve(site, commands[1], port)
    try:
        person = Browser(f"http://127.0.0.1:{port}")
        person.login()
        status, page = person.get("/admin/ctrlrun/event/")
        assert status == 200 and "EXECUTION_COMMITTED" in page
        linked = stylesheets(page)
        assert "/static/admin/css/base.css" in linked and "/static/ctrlrun/console.css" in linked, linked
        for href in linked:
            status, css = person.get(href)
            assert status == 200 and css.strip(), href
        assert ".ctrlrun-badge" in person.get("/static/ctrlrun/console.css")[1]
        assert "--body-bg" in person.get("/static/admin/css/base.css")[1]
    finally:
        server.terminate()
        server.wait(timeout=30)
