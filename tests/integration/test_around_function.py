"""The driver's around_function hook: entered around each run of the function, sync and async, in the
function's context, and unable to break a call or hide its exception."""
from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging

import pytest

from ctrlrun.control import Control
from ctrlrun.kernel import drive

pytestmark = pytest.mark.usefixtures("store_db")

seen: contextvars.ContextVar[str | None] = contextvars.ContextVar("seen", default=None)


@pytest.fixture
def hook():
    entered: list[str] = []
    registered: list = []

    def add(factory):
        drive.around_function(factory)
        registered.append(factory)

    yield add, entered
    for factory in registered:
        drive.remove_around_function(factory)


def test_the_hook_wraps_sync_and_async_runs_in_their_context(hook):
    add, entered = hook

    @contextlib.contextmanager
    def around(action):
        entered.append(action.name)
        token = seen.set(action.action_id)
        try:
            yield
        finally:
            seen.reset(token)

    add(around)
    control = Control()
    got = control.call("email.send", {"msg_id": "h1"}, lambda: seen.get(), principal="mailer")
    assert got.startswith("act_")

    async def coroutine():
        return seen.get()

    async def main():
        return await asyncio.gather(
            control.acall("email.send", {"msg_id": "h2"}, coroutine, principal="mailer"),
            control.acall("email.send", {"msg_id": "h3"}, lambda: seen.get(), principal="mailer"))

    values = asyncio.run(main())
    drive.shutdown()
    assert all(v.startswith("act_") for v in values) and len(set(values)) == 2
    assert entered == ["email.send"] * 3
    assert seen.get() is None


def test_a_failing_hook_is_logged_and_never_hides_the_functions_exception(hook, caplog):
    add, _ = hook

    def broken_factory(action):
        raise RuntimeError("hook broke")

    class SwallowingExit:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return True  # would hide the function's error: ignored

    add(broken_factory)
    add(lambda action: SwallowingExit())
    with caplog.at_level(logging.ERROR):
        assert Control().call("email.send", {"msg_id": "h4"}, lambda: "sent", principal="mailer") == "sent"

        def lost():
            raise TimeoutError("read timed out")

        with pytest.raises(TimeoutError):
            Control().call("email.send", {"msg_id": "h5"}, lost, principal="mailer")
    assert "hook broke" in caplog.text
