"""Fixtures several integration modules share (a module's own fixture of the same name overrides one here)."""
from __future__ import annotations

import asyncio

import pytest

from ctrlrun.control import Control
from tests.support import make_user


@pytest.fixture(params=["sync", "async"])
def drive(request):
    """Call ``control`` for ``name`` as ``agent`` through one of the two drivers (``call`` / ``await acall``)."""
    def call(control: Control, name: str, arguments: dict, agent: str, executor=lambda: "done", **options):
        if request.param == "sync":
            return control.call(name, arguments, executor, principal=agent, **options)

        async def awaited():
            return executor()

        return asyncio.run(control.acall(name, arguments, awaited, principal=agent, **options))

    return call


@pytest.fixture
def as_role(client):
    """Log the test client in as a user of that role (``anonymous``: nobody); returns the user."""

    def login(role: str, username: str | None = None):
        if role == "anonymous":
            return None
        user = make_user(role, username)
        client.force_login(user)
        return user

    return login
