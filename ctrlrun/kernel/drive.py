"""The two drivers of a call's steps: synchronous, and asynchronous.

Both take the generator ``steps.call_steps`` makes and do what it yields; neither decides anything.

The synchronous driver does each instruction in the calling thread.

The asynchronous driver never blocks the event loop on the database. Store phases run on
ctrlrun's own small pool of threads (``CTRLRUN_ASYNC_THREADS``, default 4) rather than through
``sync_to_async``:

- ``thread_sensitive=True`` would send every phase of every task through *one* thread (under
  ASGI, the request's own sync thread, shared with the view's ORM work): two hundred concurrent
  calls would queue behind each other and behind the application;
- ``thread_sensitive=False`` (or ``asyncio.to_thread``) uses an executor shared with the rest of
  the program, whose threads come and go, each opening a database connection nobody closes.

A pool of its own keeps the number of ctrlrun's connections fixed and known, and
``shutdown()`` closes them (tests, and a program that wants to exit cleanly). Context variables
(the principal, the Control's database and clock) are copied into the thread for each phase.

The user's ``async def`` is awaited on the loop; a synchronous function given to the async entry
runs in a thread of the loop's default executor (it may be slow, and must not hold a store
thread). Async reconcile hooks are awaited; sync ones run in a thread.

Cancellation (``task.cancel()``, a timeout): a store phase already started runs to its end in its
thread (a transaction is never cut in half), and the cancellation is delivered at the next step.
From then on only ``Record`` phases run (what already happened is written down); no other phase
starts - no key is taken, no approval spent, nobody is waited for. Cancelled after the key was
taken but before the function started: the reservation is released as ``failed`` ("cancelled
before its function started"; nothing ran, a retry is allowed). Cancelled while an ``async def``
runs: ``Abandoned`` is thrown into the steps; a keyed call records nothing, its lease stops being
renewed and the sweeper later marks it ambiguous (an interrupted call, never ``failed``); an
unkeyed call, which no sweeper will find, is recorded ambiguous at once. A synchronous function
running in a thread cannot be interrupted: it is waited for, its outcome recorded, and then the
task is cancelled. The caller always gets ``CancelledError``. A ``CancelledError`` the function
raises itself, its task not being cancelled, is an outcome like any other exception (ambiguous).

The default executor's threads (sync executors of ``acall``, sync reconcile hooks) are the
loop's, not ctrlrun's: if they use the ORM, their connections are the application's to close.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import inspect
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from .. import heartbeat, transport
from ..canonical import evidence_text
from ..errors import NotExecuted
from ..states import RECONCILE_ANSWERS
from ..values import HookAnswer
from .context import running_attempt
from .runtime import Runtime
from .steps import Abandoned, Ask, Consult, Pause, Phase, Record, Run, Steps

logger = logging.getLogger("ctrlrun")

__all__ = ["run_sync", "run_async", "run_phase", "call_hook", "acall_hook", "shutdown", "CANCELLED_BEFORE_START",
           "around_function", "remove_around_function"]

CANCELLED_BEFORE_START = "the call was cancelled before its function started; nothing ran"


# --------------------------------------------------------------------------- hooks


def _answer(answer: Any, effect_key: str, started: float) -> Any:
    if isinstance(answer, str) and answer in RECONCILE_ANSWERS:
        return HookAnswer(answer, duration=time.monotonic() - started)
    logger.warning("reconcile hook for %s returned %r, not one of %s", effect_key, answer, sorted(RECONCILE_ANSWERS))
    return HookAnswer("unknown", "invalid_return", evidence_text(repr(answer)), time.monotonic() - started)


def _raised(exc: Exception, effect_key: str, started: float) -> Any:
    logger.warning("reconcile hook for %s raised %s: %s", effect_key, type(exc).__name__, exc)
    return HookAnswer("unknown", "raised", evidence_text(f"{type(exc).__name__}: {exc}"), time.monotonic() - started)


def call_hook(hook: Callable[[str], Any], effect_key: str) -> Any:
    """Ask a hook, here; an Exception or an answer outside the three becomes a recorded 'unknown'.
    An ``async def`` hook is run to completion on a new event loop (there is none in this thread)."""
    started = time.monotonic()
    try:
        answer = hook(effect_key)
        if inspect.isawaitable(answer):
            answer = asyncio.run(_awaited(answer))
    except Exception as exc:
        return _raised(exc, effect_key, started)
    return _answer(answer, effect_key, started)


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


async def _consulted(op: Consult) -> Any:
    """A user's callback from an event loop: awaited when ``async def``, else run in a thread (it may
    read the database, as a scope provider asking the app's permissions does)."""
    if inspect.iscoroutinefunction(op.fn):
        return await op.fn(op.argument)
    answer = await asyncio.to_thread(op.fn, op.argument)
    return (await answer) if inspect.isawaitable(answer) else answer


async def acall_hook(hook: Callable[[str], Any], effect_key: str) -> Any:
    """``call_hook`` from an event loop: an async hook is awaited, a sync one runs in a thread."""
    started = time.monotonic()
    try:
        if inspect.iscoroutinefunction(hook):
            answer = await hook(effect_key)
        else:
            answer = await asyncio.to_thread(hook, effect_key)
            if inspect.isawaitable(answer):
                answer = await answer
    except Exception as exc:
        return _raised(exc, effect_key, started)
    return _answer(answer, effect_key, started)


# --------------------------------------------------------------------------- the function's run

#: Factories of context managers entered around every run of a user's function (``around_function``).
_around: list[Callable[[Any], Any]] = []


def around_function(factory: Callable[[Any], Any]) -> None:
    """The driver's one hook: ``factory(action)`` is called as each attempt's function is about to run,
    sync or async, and the context manager it returns is entered around the run, in the caller's
    context: in the calling thread (sync), in the task on the loop (``async def``), and copied into
    the executor thread of a sync function given to ``acall``. So a context variable it sets (an
    OpenTelemetry span made current) is what the function sees. ``action`` is the ``ctrlrun.Action``.
    The factory itself is called inside the running Control's scope, so ``ctrlrun.observers.wanted()``
    there names the observers that will hear of this call (the manager is entered outside it).

    It cannot break a call: a factory, an ``__enter__`` or an ``__exit__`` that raises is logged and
    the function runs (or its outcome is recorded) as without it; it never swallows the function's
    exception. Enter order is registration order; ``remove_around_function`` takes one away."""
    if factory not in _around:
        _around.append(factory)


def remove_around_function(factory: Callable[[Any], Any]) -> None:
    if factory in _around:
        _around.remove(factory)


class _Around:
    """One hook's context manager, kept from failing the call."""

    def __init__(self, factory: Callable[[Any], Any], action: Any, control: Runtime) -> None:
        self.factory, self.action, self.control, self.manager = factory, action, control, None

    def __enter__(self) -> None:
        try:
            with self.control.scope():  # so the factory can ask who hears this call (observers.wanted())
                manager = self.factory(self.action)
            manager.__enter__()
            self.manager = manager
        except Exception:
            logger.exception("a ctrlrun around_function hook %r failed before the function ran", self.factory)

    def __exit__(self, *exc: Any) -> bool:
        if self.manager is not None:
            try:
                self.manager.__exit__(*exc)
            except Exception:
                logger.exception("a ctrlrun around_function hook %r failed after the function ran", self.factory)
        return False


class _Running:
    """Around the user's function: the transport register open (so ``ctrlrun.transport`` can tell
    a call that never connected), its attempt in the context, and its lease renewed on its store."""

    def __init__(self, op: Run, control: Runtime) -> None:
        self.op, self.control = op, control

    def __enter__(self) -> _Running:
        op, stack = self.op, contextlib.ExitStack()
        self.stack = stack
        try:
            stack.enter_context(transport.executor_scope())
            if op.key is not None:  # (held or not: observe mode's unheld run sees the same token)
                token = running_attempt.set((op.key, op.attempt))
                stack.callback(running_attempt.reset, token)
            if op.call is not None:
                renewing = heartbeat.hold(op.call, op.attempt, op.lease, self.control.bound_scope())
                stack.callback(heartbeat.release, renewing)  # the moment the function is done, renewal stops
            for factory in tuple(_around):
                stack.enter_context(_Around(factory, op.action, self.control))
        except BaseException:
            stack.close()
            raise
        return self

    def __exit__(self, *exc: Any) -> bool:
        return bool(self.stack.__exit__(*exc))


def _phase(control: Runtime, op: Phase) -> Any:
    with control.scope():
        return op.fn(*op.args, **op.kwargs)


# --------------------------------------------------------------------------- synchronous


def run_sync(steps: Steps, control: Runtime) -> Any:
    """Drive ``steps`` in this thread; return the function's value or raise what the steps raise."""
    send: Any = None
    throw: BaseException | None = None
    while True:
        try:
            op = steps.send(send) if throw is None else steps.throw(throw)
        except StopIteration as stop:
            return stop.value
        send = throw = None
        try:
            if isinstance(op, Phase):
                send = _phase(control, op)
            elif isinstance(op, Run):
                with _Running(op, control):
                    send = op.invoke(op.action)
            elif isinstance(op, Ask):
                send = call_hook(op.hook, op.effect_key)
            elif isinstance(op, Consult):
                send = op.fn(op.argument)
                if inspect.isawaitable(send):
                    send = asyncio.run(_awaited(send))
            elif isinstance(op, Pause):
                time.sleep(op.seconds)
            else:  # pragma: no cover - a programming error in the steps
                raise AssertionError(f"unknown instruction {op!r}")
        except BaseException as exc:
            throw = exc
        finally:
            op = None  # no reference cycle through a frame kept by an exception


# --------------------------------------------------------------------------- asynchronous


class _StoreThreads:
    """A fixed set of threads running store phases for event loops; each keeps one connection."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._pid = os.getpid()

    def submit(self, fn: Callable[[], Any]) -> concurrent.futures.Future[Any]:
        if self._pid != os.getpid():  # a forked child has none of its parent's threads
            self.__init__()  # type: ignore[misc]
        if not self._threads:
            self._start()
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._jobs.put((fn, future))
        return future

    def _start(self) -> None:
        from .. import conf, standalone

        standalone.configure_settings()  # a plain script's first async call: settings come first
        with self._lock:
            if self._threads:
                return
            for number in range(conf.async_threads()):
                thread = threading.Thread(target=self._work, name=f"ctrlrun-store-{number}", daemon=True)
                thread.start()
                self._threads.append(thread)

    def _work(self) -> None:
        try:
            while True:
                job = self._jobs.get()
                if job is None:
                    return
                fn, future = job
                if not future.set_running_or_notify_cancel():
                    continue
                try:
                    future.set_result(fn())
                except BaseException as exc:
                    future.set_exception(exc)
                del job, fn, future
        finally:
            from django.db import connections

            connections.close_all()  # this thread's connections, and only those

    def shutdown(self) -> None:
        """Stop the threads, each closing its database connections (they start again on demand)."""
        with self._lock:
            threads, self._threads = self._threads, []
            for _ in threads:
                self._jobs.put(None)
        for thread in threads:
            thread.join()


_threads = _StoreThreads()


def shutdown() -> None:
    """Close the store threads of async calls and their database connections."""
    _threads.shutdown()


class _PhaseCancelled(Exception):
    def __init__(self, future: concurrent.futures.Future[Any], cancel: asyncio.CancelledError) -> None:
        self.future, self.cancel = future, cancel


async def _run_phase(control: Runtime, op: Phase) -> Any:
    context = contextvars.copy_context()
    future = _threads.submit(lambda: context.run(_phase, control, op))
    return await _uncut(future)


async def run_phase(control: Runtime, op: Phase) -> Any:
    """One store operation from an event loop, on a store thread in ``control``'s scope (the
    caller's context copied in); a cancellation waits for it to finish, then is raised."""
    try:
        return await _run_phase(control, op)
    except _PhaseCancelled as stopped:
        raise stopped.cancel from None


async def _uncut(future: concurrent.futures.Future[Any]) -> Any:
    """Await work that must run to its end: a cancellation waits for it, then is handed on."""
    waiting = asyncio.wrap_future(future)
    try:
        return await asyncio.shield(waiting)
    except asyncio.CancelledError as cancel:
        while not waiting.done():
            try:
                await asyncio.wait([waiting])
            except asyncio.CancelledError:
                continue
        raise _PhaseCancelled(future, cancel) from None


async def _run_function(op: Run, control: Runtime) -> Any:
    with _Running(op, control):
        if op.awaitable:
            try:
                return await op.invoke(op.action)
            except asyncio.CancelledError as cancel:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise _Interrupted(cancel) from None
                raise _Raised(cancel) from None  # the function's own CancelledError: an outcome like any other
        context = contextvars.copy_context()
        loop = asyncio.get_running_loop()
        return await _uncut(loop.run_in_executor(None, context.run, op.invoke, op.action))  # type: ignore[arg-type]


class _Interrupted(Exception):
    def __init__(self, cancel: asyncio.CancelledError) -> None:
        self.cancel = cancel


class _Raised(Exception):
    """The function raised ``CancelledError`` itself while its task was not being cancelled."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


async def run_async(steps: Steps, control: Runtime) -> Any:
    """Drive ``steps`` on the running event loop, never blocking it on the database."""
    send: Any = None
    throw: BaseException | None = None
    cancelled: asyncio.CancelledError | None = None
    while True:
        try:
            op = steps.send(send) if throw is None else steps.throw(throw)
        except StopIteration as stop:
            if cancelled is not None:
                raise cancelled from None
            return stop.value
        except BaseException as exc:
            if cancelled is not None and exc is not cancelled:
                if not isinstance(exc, (Abandoned, NotExecuted)):
                    logger.warning("a cancelled ctrlrun call also failed: %s: %s", type(exc).__name__, exc)
                raise cancelled from None
            raise
        send = throw = None
        if cancelled is not None and not isinstance(op, Record):
            # After a cancellation only the steps' recording of what already happened still runs:
            # no key is taken, no approval spent, no function started, nobody waited for.
            throw = NotExecuted(CANCELLED_BEFORE_START) if isinstance(op, Run) else cancelled
            continue
        try:
            if isinstance(op, Phase):
                send = await _run_phase(control, op)
            elif isinstance(op, Run):
                send = await _run_function(op, control)
            elif isinstance(op, Ask):
                send = await acall_hook(op.hook, op.effect_key)
            elif isinstance(op, Consult):
                send = await _consulted(op)
            elif isinstance(op, Pause):
                await asyncio.sleep(op.seconds)
            else:  # pragma: no cover - a programming error in the steps
                raise AssertionError(f"unknown instruction {op!r}")
        except _PhaseCancelled as stopped:
            cancelled = stopped.cancel
            try:
                send = stopped.future.result()
            except BaseException as exc:
                throw = exc
        except _Interrupted as interrupted:
            cancelled = interrupted.cancel
            throw = Abandoned()
        except _Raised as raised:
            throw = raised.error
        except asyncio.CancelledError as cancel:
            cancelled = throw = cancel
        except BaseException as exc:
            throw = exc
        finally:
            op = None
