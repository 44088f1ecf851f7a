"""A real SMTP server on loopback (aiosmtpd, in a thread of the test process), one that refuses every
mail, and a port where nothing listens; Django's smtp EmailBackend pointed at each."""
from __future__ import annotations

import os
import socket
from pathlib import Path
from email import message_from_bytes, policy
from email.message import EmailMessage

from aiosmtpd.controller import Controller

__all__ = ["SmtpServer", "closed_port", "smtp_settings", "notify_project"]


class _Keep:
    def __init__(self, refuse: str | None, refuse_to: frozenset[str]) -> None:
        self.refuse, self.refuse_to = refuse, refuse_to
        self.mails: list[EmailMessage] = []

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):  # noqa: N802
        if self.refuse:
            return self.refuse
        if address in self.refuse_to:
            return "450 4.2.1 mailbox busy, try again later"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server, session, envelope):  # noqa: N802
        mail = message_from_bytes(envelope.original_content or envelope.content, policy=policy.default)
        mail["X-Envelope-To"] = ", ".join(envelope.rcpt_tos)
        self.mails.append(mail)
        return "250 Message accepted"


class SmtpServer:
    """``with SmtpServer() as smtp: ... smtp.mails``; ``SmtpServer(refuse="451 ...")`` refuses every mail,
    ``refuse_to={address}`` the mails to those addresses (450, try later)."""

    def __init__(self, refuse: str | None = None, refuse_to: frozenset[str] | set[str] = frozenset()) -> None:
        self.handler = _Keep(refuse, frozenset(refuse_to))
        self.port = closed_port()  # a free loopback port (aiosmtpd's start checks the port it was given)
        self.controller = Controller(self.handler, hostname="127.0.0.1", port=self.port)

    def __enter__(self) -> SmtpServer:
        self.controller.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.controller.stop()

    @property
    def mails(self) -> list[EmailMessage]:
        return self.handler.mails


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed): a server that is down."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def smtp_settings(settings, port: int) -> None:
    """Django's own SMTP backend, to 127.0.0.1:``port``, with a bounded timeout."""
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT, settings.EMAIL_TIMEOUT = "127.0.0.1", port, 10
    settings.EMAIL_USE_TLS = settings.EMAIL_USE_SSL = False
    settings.EMAIL_HOST_USER = settings.EMAIL_HOST_PASSWORD = ""


def notify_project(folder: Path, port: int) -> dict[str, str]:
    """The environment of a ``manage.py`` child process on the test database (the tests' settings), mailing
    through 127.0.0.1:``port``: a settings module written to ``folder``."""
    from django.db import connection

    from .base import REPO

    (folder / "notify_settings.py").write_text(
        "from tests.settings import *  # noqa\n"
        f"DATABASES['default']['NAME'] = {connection.settings_dict['NAME']!r}\n"
        "EMAIL_BACKEND = 'django.core.mail.backends.smtp.EmailBackend'\n"
        f"EMAIL_HOST, EMAIL_PORT, EMAIL_TIMEOUT = '127.0.0.1', {port}, 10\n"
        "CTRLRUN_NOTIFY_BASE_URL = 'https://ops.example.test'\n")
    env = {k: v for k, v in os.environ.items() if k not in ("CTRLRUN_STATE", "CTRLRUN_STORE_URL")}
    env.update(PYTHONPATH=f"{REPO}{os.pathsep}{folder}", DJANGO_SETTINGS_MODULE="notify_settings")
    return env
