"""The README's recipe for a Django project, as written, in a fresh ``django-admin startproject``
(issue 9, part 3): the settings lines appended verbatim, the front-page template saved where the
README says, ``migrate``, a superuser, then ``GET /admin/`` with Django's test client inside that
project: the overview's tiles render, and the stylesheet the tag links is found and served
(``runserver`` with DEBUG on, over HTTP). Real subprocesses, the venv's own ``django-admin``."""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tests.support import REPO

DJANGO_ADMIN = Path(sys.executable).with_name("django-admin")

CLIENT_SCRIPT = """
import json
from django.contrib.auth import get_user_model
from django.contrib.staticfiles import finders
from django.test import Client
from django.test.utils import setup_test_environment

setup_test_environment()
user = get_user_model().objects.create_superuser("root", "root@example.com", "a-password-for-tests")
client = Client()
client.force_login(user)
page = client.get("/admin/")
html = page.content.decode()
links = [href for href in __import__("re").findall(r'<link rel="stylesheet" href="([^"]+)"', html)
         if "ctrlrun" in href]
print(json.dumps({"status": page.status_code, "overview": 'id="ctrlrun-overview"' in html,
                  "tiles": html.count('class="tile'), "links": links,
                  "found": bool(finders.find("ctrlrun/overview.css"))}))
"""


def recipe() -> tuple[str, str, str]:
    """(settings lines, template path, template text) from the README's 'In a Django project' section."""
    readme = (REPO / "README.md").read_text()
    section = readme.split("## In a Django project\n", 1)[1].split("\n## ", 1)[0]
    settings = re.search(r"```python(?: fragment)?\n(# settings\.py\n.*?)```", section, re.S)
    template = re.search(r"```html\+django\n(.*?)```", section, re.S)
    path = re.search(r"save this\s+as `([^`]+\.html)`", section)
    assert settings and template and path, "the README's Django recipe has no settings block, template or path"
    return settings.group(1), path.group(1), template.group(1)


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CTRLRUN_", "DJANGO_")) and k != "DATABASE_URL"}
    env["PYTHONPATH"] = ""  # the fresh project, and the installed ctrlrun, nothing of this repository's tests
    return env


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_readme_recipe_works_verbatim_in_a_fresh_startproject(tmp_path):
    settings_lines, template_path, template = recipe()
    env = clean_env()
    subprocess.run([str(DJANGO_ADMIN), "startproject", "mysite", str(tmp_path)], check=True, env=env, timeout=120)
    settings = tmp_path / "mysite" / "settings.py"
    settings.write_text(settings.read_text() + "\n" + settings_lines)
    (tmp_path / template_path).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / template_path).write_text(template)
    manage = [sys.executable, str(tmp_path / "manage.py")]

    migrated = subprocess.run([*manage, "migrate"], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=300)
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    assert "Applying ctrlrun.0009_chain_checks... OK" in migrated.stdout
    shown = subprocess.run([*manage, "shell", "-c", CLIENT_SCRIPT], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=300)
    assert shown.returncode == 0, shown.stderr
    result = json.loads(shown.stdout.strip().splitlines()[-1])
    assert result["status"] == 200 and result["overview"] and result["tiles"] == 4, result
    assert result["links"] == ["/static/ctrlrun/overview.css"] and result["found"], result

    port = free_port()
    server = subprocess.Popen([*manage, "runserver", "--noreload", f"127.0.0.1:{port}"], cwd=tmp_path, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{result['links'][0]}", timeout=5) as reply:
                    status, css = reply.status, reply.read().decode()
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise
                time.sleep(0.3)
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert status == 200 and ".ctrlrun-overview a.tile" in css
