"""Fresh Django projects and script folders built as the README says, and the console script run in them."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any



from .base import REPO



# ------------------------------------------------------------- site25: a fresh startproject, from the README

#: The venv's own ``django-admin`` (the one beside this Python).
DJANGO_ADMIN = Path(sys.executable).with_name("django-admin")


def readme_django_section() -> str:
    """The README's "In a Django project" section (up to the next ``## `` heading)."""
    readme = (REPO / "README.md").read_text()
    return readme.split("## In a Django project\n", 1)[1].split("\n## ", 1)[0]


def readme_recipe() -> dict[str, Any]:
    """What the README's Django section tells a reader to do, parsed from it (a test of it breaks when
    the README changes): ``settings`` (the lines for settings.py), ``template_path`` and ``template``
    (the front page), ``serving`` (the settings lines to serve it under gunicorn) and ``commands``
    (the serving block's ``$ `` lines, in order)."""
    import re

    section = readme_django_section()
    settings = re.findall(r"```python fragment\n(# settings\.py.*?)```", section, re.S)
    template = re.search(r"```html\+django\n(.*?)```", section, re.S)
    path = re.search(r"save this\s+as `([^`]+\.html)`", section)
    assert settings and template and path, "the README's Django recipe has no settings block, template or path"
    serving = [block for block in settings[1:] if "whitenoise" in block]
    commands = [line[2:] for block in re.findall(r"```text\n(.*?)```", section, re.S) if "gunicorn" in block
                for line in block.splitlines() if line.startswith("$ ")]
    return {"settings": settings[0], "template_path": path.group(1), "template": template.group(1),
            "serving": serving[0] if serving else "", "commands": commands}


def startproject_environment() -> dict[str, str]:
    """This environment without the tests' settings: the fresh project's own, and the installed ctrlrun."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CTRLRUN_", "DJANGO_")) and k != "DATABASE_URL"}
    env["PYTHONPATH"] = ""
    return env


class StartprojectSite:
    """``django-admin startproject mysite`` in ``folder``, with the README's lines applied as written."""

    def __init__(self, folder: Path, *, policy: str | None, serving: bool = False) -> None:
        self.folder = Path(folder)
        self.env = startproject_environment()
        self.recipe = readme_recipe()
        subprocess.run([str(DJANGO_ADMIN), "startproject", "mysite", str(self.folder)], check=True, env=self.env,
                       timeout=120, capture_output=True)
        settings = self.folder / "mysite" / "settings.py"
        added = self.recipe["settings"] + ("\n" + self.recipe["serving"] if serving else "")
        settings.write_text(settings.read_text() + "\n" + added)
        template = self.folder / self.recipe["template_path"]
        template.parent.mkdir(parents=True, exist_ok=True)
        template.write_text(self.recipe["template"])
        if policy is not None:
            (self.folder / "ctrlrun.yaml").write_text(policy)

    def manage(self, *args: str, timeout: float = 300, env: dict[str, str] | None = None,
               ) -> subprocess.CompletedProcess:
        """``python manage.py ARGS`` in the project, its output captured (never raises on an exit code)."""
        return subprocess.run([sys.executable, str(self.folder / "manage.py"), *args], cwd=self.folder,
                              env={**self.env, **(env or {})}, capture_output=True, text=True, timeout=timeout)

    def shell(self, code: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return self.manage("shell", "-c", code, timeout=timeout)


# --------------------------------------------------------------------------- the console script in a plain folder


def script_env(**extra: str) -> dict[str, str]:
    """The environment of a plain script's folder: no project, no store variables (``extra`` added)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("CTRLRUN_") and k not in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL", "SECRET_KEY")}
    env["PYTHONPATH"] = str(REPO)
    env.update(extra)
    return env


def script_run(folder: Path, *args: str, env: dict[str, str] | None = None, **options) -> subprocess.CompletedProcess:
    """``ctrlrun ARGS...`` as an OS process in ``folder`` (stdin not a terminal unless given)."""
    options.setdefault("stdin", subprocess.DEVNULL)
    return subprocess.run([sys.executable, "-m", "ctrlrun", *args], cwd=folder, env=env or script_env(),
                          capture_output=True, text=True, timeout=120, **options)


#: A script whose email.send times out: its key email:m1 is left AMBIGUOUS in the folder's store.
CLI25_AMBIGUOUS_SCRIPT = (
    "import ctrlrun\n"
    "@ctrlrun.protect('email.send', effect='email:{msg_id}')\n"
    "def send(msg_id: str) -> None:\n"
    "    raise TimeoutError('smtp timed out')\n"
    "with ctrlrun.context(agent='mailer'):\n"
    "    try:\n"
    "        send(msg_id='m1')\n"
    "    except TimeoutError:\n"
    "        pass\n")

CLI25_POLICY = """\
schema: ctrlrun.policy/v2
actions:
  email.send:
    effect: "email:{msg_id}"
    decision: allow
"""


def script_ambiguous_folder(folder: Path) -> Path:
    """``folder`` with a policy and a store holding one AMBIGUOUS effect, email:m1."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "ctrlrun.yaml").write_text(CLI25_POLICY)
    made = subprocess.run([sys.executable, "-c", CLI25_AMBIGUOUS_SCRIPT], cwd=folder, env=script_env(),
                          capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    return folder


def script_manage(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python manage.py ARGS...`` as an OS process in the repository (the example project)."""
    return subprocess.run([sys.executable, "manage.py", *args], cwd=REPO, env=env or script_env(SECRET_KEY="cli-key"),
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


def script_loop(folder: Path, *args: str, seconds: float = 3.0, lines: int = 0) -> tuple[str, str, int]:
    """``ctrlrun ARGS...`` (a loop) as an OS process, then Ctrl-C (SIGINT): its stdout, stderr and exit status.

    The interrupt comes ``seconds`` after the loop has started (it holds the folder's store open:
    Django's setup is behind it, however slow the machine), and not before it has printed ``lines``
    lines. Counting from the start of the process instead let a loaded machine interrupt the
    setup itself, or leave too few passes for the test."""
    import signal
    import threading
    import time

    store = (folder / ".ctrlrun" / "state.db").resolve()
    proc = subprocess.Popen([sys.executable, "-m", "ctrlrun", *args], cwd=folder, env=script_env(),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    printed: list[str] = []
    errors: list[str] = []
    readers = [threading.Thread(target=lambda: printed.extend(proc.stdout), daemon=True),
               threading.Thread(target=lambda: errors.append(proc.stderr.read()), daemon=True)]
    for reader in readers:
        reader.start()
    try:
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline and not _holds_open(proc.pid, store):
            time.sleep(0.02)
        time.sleep(seconds)
        while proc.poll() is None and time.monotonic() < deadline and len(printed) < lines:
            time.sleep(0.02)
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    for reader in readers:
        reader.join(timeout=30)
    return "".join(printed), "".join(errors), proc.returncode


def _holds_open(pid: int, path: Path) -> bool:
    """Whether process ``pid`` has ``path`` open (Linux's /proc)."""
    try:
        return any(os.path.realpath(f"/proc/{pid}/fd/{fd}") == str(path) for fd in os.listdir(f"/proc/{pid}/fd"))
    except OSError:  # it ended, or a descriptor closed while being read
        return False
