"""Django-native resumption: an agent framework's paused run, kept beside the ctrlrun approval it
waits on, resumed from another process once a person answered (docs/resumption.md).

- :func:`pause` stores a paused run (``PausedRun``): the approval request's id, the framework, the
  paused state as JSON text and ``resume_with``, the name of a registered resumer. Each adapter has
  a one-liner that builds the state (``ctrlrun.adapters.<framework>.pause(...)``).
- :func:`resumer` registers the application's function that rebuilds the run and continues it:
  ``fn(paused: PausedRunView, answer: Answer)``; plain or ``async def``.
- :func:`resume_ready` finds pending paused runs whose request was answered (granted, denied, or
  expired - the resumer is told which, so the agent can say so) and runs each one's resumer, once:
  a process claims the row with a conditional UPDATE before running it, so two processes never
  resume the same run. ``python manage.py resume_runs`` (``ctrlrun resume_runs``) runs it.
- :func:`connect_signal_receiver` (or ``CTRLRUN_RESUME_ON_ANSWER = True``) resumes in-process, on
  the ``approval_answered`` signal, with the same claim.

A paused run is never trusted for consent: the resumed tool call still needs ctrlrun's grant for
its exact action hash, which the adapters check where the effect happens. A state edited to run
other arguments is refused (``ApprovalMismatch``). No framework is imported here.
"""
from __future__ import annotations

import asyncio
import inspect
import json
import logging
import os
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .errors import CTRLRunError, InvalidArgument
from .values import ApprovalView, PausedRunView

logger = logging.getLogger("ctrlrun.resumption")

__all__ = ["FRAMEWORKS", "Answer", "Outcome", "pause", "resumer", "resumers", "unregister", "resume_ready",
           "resume_request", "release", "connect_signal_receiver", "disconnect_signal_receiver", "discover"]

FRAMEWORKS = ("openai-agents", "langgraph", "pydantic-ai")
MAX_NAME = 200

#: name -> the application's resumer
_RESUMERS: dict[str, Callable[..., Any]] = {}


@dataclass(frozen=True)
class Answer:
    """What a person's answer was, as the resumer is told it."""

    #: ``granted``, ``denied`` or ``expired`` (nobody answered in time, or a grant ran out unused)
    status: str
    approval: ApprovalView

    @property
    def approved(self) -> bool:
        return self.status == "granted"

    @property
    def approver(self) -> str | None:
        return self.approval.approver

    @property
    def note(self) -> str | None:
        return self.approval.note

    def message(self) -> str:
        """One sentence for the model when the call will not run (a denial or an expiry)."""
        what = f"ctrlrun request {self.approval.approval_id} ({self.approval.action})"
        if self.status == "denied":
            text = f"A person ({self.approver}) denied {what}"
            return text + (f": {self.note}" if self.note else "") + ". The tool did not run."
        if self.status == "expired":
            return f"Nobody answered {what} in time; it expired. The tool did not run."
        return f"A person ({self.approver}) granted {what}."


@dataclass(frozen=True)
class Outcome:
    """What one paused run came to in a pass: resumed, failed, skipped (left pending) or taken."""

    paused_id: int
    approval_id: str
    resume_with: str
    status: str
    answer: str | None = None
    detail: str = ""

    def line(self) -> str:
        answer = f" ({self.answer})" if self.answer else ""
        return f"{self.approval_id}  {self.status}{answer}  {self.resume_with}: {self.detail}".rstrip(": ")


# --------------------------------------------------------------------------- the registry


def resumer(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``@resumer("refunds")``: the function that rebuilds and continues a run paused with
    ``resume_with="refunds"``. It is called as ``fn(paused, answer)`` (a ``PausedRunView`` and an
    :class:`Answer`); an ``async def`` one is awaited. What it returns is not kept; what it raises
    marks the paused run failed, with the error."""
    _check_name(name)

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        if not callable(fn):
            raise InvalidArgument(f"@resumer({name!r}) decorates a function, not {type(fn).__name__}")
        known = _RESUMERS.get(name)
        if known is not None and _qualified(known) != _qualified(fn):
            raise InvalidArgument(f"a resumer {name!r} is already registered ({_qualified(known)}); "
                                  f"{_qualified(fn)} needs another name")
        _RESUMERS[name] = fn
        return fn

    return register


def resumers() -> list[str]:
    """The names registered in this process."""
    return sorted(_RESUMERS)


def unregister(name: str) -> None:
    _RESUMERS.pop(name, None)


def _qualified(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def _check_name(name: Any) -> None:
    from .display import has_hidden

    if (not isinstance(name, str) or not name.strip() or len(name) > MAX_NAME or name != name.strip()
            or has_hidden(name) or any(c in name for c in "\t\n\r\x00")):
        shown = repr(name) if not isinstance(name, str) else repr(name).encode("ascii", "backslashreplace").decode()
        raise InvalidArgument(f"a resumer's name is a non-empty string of at most {MAX_NAME} characters without "
                              f"surrounding spaces, control or invisible characters, not {shown[:250]}")


def _unknown_resumer(name: str) -> str:
    known = ", ".join(repr(n) for n in resumers()) or "none"
    return (f"no resumer {name!r} is registered in this process (decorate the function with "
            f"@ctrlrun.resumption.resumer({name!r}) in a module it imports: --import MODULE); registered: {known}")


def discover(modules: Iterable[str] = ()) -> list[str]:
    """Import the modules that register resumers: each installed app's ``CTRLRUN_TOOLS_MODULE``
    (``tools.py``), then ``modules`` (``--import``); a name that does not import is a one-line error."""
    from .discovery import import_modules

    return import_modules("resumer", modules)


# --------------------------------------------------------------------------- pausing

_TOO_DEEP = ("pause: the state is nested too deeply to be read back as JSON (Python's recursion limit); "
             "a framework's paused run is never that deep")


def pause(request_id: str, framework: str, state: Any, *, resume_with: str) -> PausedRunView:
    """Store a run paused on ctrlrun request ``request_id`` (``apr_...``), to be continued by the
    resumer registered as ``resume_with`` once a person answered.

    ``state`` is JSON text (or a JSON-able dict, written as text): the adapters' ``pause`` helpers
    build it. One paused run per request; it is never replaced."""
    if not isinstance(request_id, str) or not request_id.startswith("apr_"):
        raise InvalidArgument(f"pause: the request id is the ctrlrun approval request's id (apr_...), not {request_id!r}")
    if framework not in FRAMEWORKS:
        raise InvalidArgument(f"pause: the framework is one of {', '.join(FRAMEWORKS)}, not {framework!r}")
    _check_name(resume_with)
    if resume_with not in _RESUMERS:
        raise InvalidArgument(_unknown_resumer(resume_with))
    if not isinstance(state, str):
        try:
            state = json.dumps(state, ensure_ascii=False, separators=(",", ":"))
        except RecursionError:
            raise InvalidArgument(_TOO_DEEP) from None
        except (TypeError, ValueError) as exc:
            raise InvalidArgument(f"pause: the state cannot be written as JSON ({exc})") from None
    try:
        parsed = json.loads(state)
    except RecursionError:
        raise InvalidArgument(_TOO_DEEP) from None
    except ValueError as exc:
        raise InvalidArgument(f"pause: the state is not JSON text ({exc})") from None
    if not isinstance(parsed, dict):
        raise InvalidArgument(f"pause: the state is a JSON object, not {type(parsed).__name__}")
    from . import store

    return store.save_paused_run(request_id, framework, state, resume_with)


# --------------------------------------------------------------------------- resuming


def _worker() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _answer(approval_id: str) -> tuple[str | None, ApprovalView | None]:
    """The request's answer as the resumer is told it (a lapsed request is marked expired first)."""
    from . import store
    from .states import approval_lapsed

    approval = store.get_approval(approval_id)
    if approval is None or not approval.signature_ok:  # a row changed outside ctrlrun answers nothing
        return None, approval
    if approval.status in ("pending", "granted") and approval_lapsed(approval.status, approval.expires_at, store.now()):
        approval = store.expire_if_due(approval_id) or approval
    status = {"granted": "granted", "consumed": "granted", "denied": "denied", "expired": "expired"}.get(approval.status)
    return status, approval


def _run(fn: Callable[..., Any], paused: PausedRunView, answer: Answer) -> Any:
    """Call the resumer; an ``async def`` one runs to its end in an event loop of its own."""
    result = fn(paused, answer)
    if not inspect.isawaitable(result):
        return result
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(_awaited(result))
    if inspect.iscoroutine(result):
        result.close()  # never awaited: say why instead of warning about it
    raise InvalidArgument("resuming runs from synchronous code (as the store's calls do); from async code, "
                          "call it through asgiref's sync_to_async")


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:2000]


def _resume(paused: PausedRunView) -> Outcome:
    """Claim one pending paused run and run its resumer, once."""
    from . import store

    def outcome(status: str, answer: str | None = None, detail: str = "") -> Outcome:
        return Outcome(paused.id, paused.approval_id, paused.resume_with, status, answer, detail)

    if not paused.signature_ok:  # left pending, never resumed: what it would resume with is not ctrlrun's
        return outcome("skipped", detail=f"the run paused on {paused.approval_id} does not carry ctrlrun's signature "
                                         "(its request, state or resumer was changed outside ctrlrun); not resumed")
    fn = _RESUMERS.get(paused.resume_with)
    if fn is None:  # left pending, for a process that knows it
        return outcome("skipped", detail=_unknown_resumer(paused.resume_with))
    status, approval = _answer(paused.approval_id)
    worker = _worker()
    if approval is None:
        claimed_at = store.claim_paused_run(paused.id, "unknown", worker)
        if not claimed_at:
            return outcome("taken", detail="another process claimed it first")
        error = f"the approval request {paused.approval_id} is not in the store"
        store.finish_paused_run(paused.id, error=error, claim=(worker, claimed_at))
        return outcome("failed", detail=error)
    if not approval.signature_ok:  # left pending: resumed only on an answer ctrlrun recorded
        return outcome("skipped", detail=f"the approval request {paused.approval_id} does not carry ctrlrun's "
                                         "signature (its row was changed outside ctrlrun); not resumed on it")
    if status is None:
        return outcome("skipped", detail=f"the request is still {approval.status}")
    claimed_at = store.claim_paused_run(paused.id, status, worker)
    if not claimed_at:
        return outcome("taken", status, "another process claimed it first")
    claim = (worker, claimed_at)
    claimed = store.get_paused_run(paused.id) or paused
    try:
        _run(fn, claimed, Answer(status, approval))
    except Exception as exc:  # noqa: BLE001 - the resumer's failure is the run's, recorded
        store.finish_paused_run(paused.id, error=_one_line(exc), claim=claim)
        return outcome("failed", status, _one_line(exc))
    except BaseException:  # Ctrl-C inside the resumer: recorded, never resumed again
        store.finish_paused_run(paused.id, error="interrupted while resuming", claim=claim)
        raise
    store.finish_paused_run(paused.id, claim=claim)
    return outcome("resumed", status, f"paused run {paused.id}")


def resume_ready(limit: int | None = None) -> list[Outcome]:
    """One pass: every pending paused run whose request was answered or expired, its resumer run
    once (at most ``limit`` of them, oldest first). A run whose resumer is not registered in this
    process is left pending (``skipped``); one another process claimed first is ``taken``."""
    from . import store

    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        raise InvalidArgument(f"resume_ready(limit=...) is a whole number of at least 1, not {limit!r}")
    return [_resume(paused) for paused in store.ready_paused_runs(limit)]


def resume_request(approval_id: str) -> Outcome | None:
    """Resume the run paused on ``approval_id`` now, if there is one, it is pending, and its
    request is answered; None when there is nothing to do."""
    from . import store

    paused = store.paused_run_for(approval_id)
    if paused is None or paused.status != "pending":
        return None
    return _resume(paused)


def release(approval_id: str, *, by: str, reason: str | None = None) -> PausedRunView:
    """A person's way out for a run stuck in ``resuming`` (its process crashed or was killed after
    claiming it): back to ``pending``, so the next pass resumes it, with who, when and why recorded.

    Only a claim older than ``CTRLRUN_RESUME_RELEASE_AFTER_SECONDS`` (ten minutes by default) is
    released. Releasing a run whose process is in fact still alive can resume it twice at the
    agent's level; the effect itself is still deduplicated by its effect key, and ctrlrun's grant
    is used once (docs/resumption.md)."""
    from . import conf, store

    if not isinstance(approval_id, str) or not approval_id.strip():
        raise InvalidArgument(f"release: the request id is the ctrlrun approval request's id (apr_...), not {approval_id!r}")
    if not isinstance(by, str) or not by.strip() or len(by) > MAX_NAME:
        raise InvalidArgument(f"release: --by names the person releasing the run (at most {MAX_NAME} characters), "
                              f"not {by!r}")
    if reason is not None and (not isinstance(reason, str) or len(reason) > 4000):
        raise InvalidArgument("release: --reason is text of at most 4000 characters")
    return store.release_paused_run(approval_id, by=by.strip(), reason=(reason or "").strip() or None,
                                    older_than=conf.resume_release_after())


# --------------------------------------------------------------------------- the signal receiver

_DISPATCH_UID = "ctrlrun-resume-on-answer"


def _on_answer(sender: str, event: Any, **_: Any) -> None:
    approval_id = getattr(event, "approval_id", None)
    if not approval_id:
        return
    try:
        outcome = resume_request(approval_id)
    except CTRLRunError as exc:
        logger.error("ctrlrun: could not resume the run paused on %s: %s", approval_id, exc)
        return
    if outcome is not None and outcome.status == "failed":
        logger.warning("ctrlrun: %s", outcome.line())
    elif outcome is not None and outcome.status == "skipped":
        logger.info("ctrlrun: %s (left for resume_runs)", outcome.line())


def connect_signal_receiver() -> None:
    """Resume paused runs in this process when a person answers (the ``approval_answered`` signal,
    sent after the answer commits). The claim is the same as ``resume_runs``'s: at most once."""
    from .signals import approval_answered

    approval_answered.connect(_on_answer, dispatch_uid=_DISPATCH_UID, weak=False)


def disconnect_signal_receiver() -> None:
    from .signals import approval_answered

    approval_answered.disconnect(dispatch_uid=_DISPATCH_UID)
