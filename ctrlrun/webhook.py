"""Webhook approvals (§D6): a signed ``ctrlrun.approval_request/v1`` POSTed when a request is made,
and the signed answer that comes back.

Outbound, ``WebhookApprovalProvider`` records the request first (the store's pending row, bound to
the action's hash, exactly as the console's), then delivers its body to ``url`` on a background
thread: the agent's call is never held up by a slow receiver, and a delivery that fails after every
retry leaves the request pending, with a log line (``ctrlrun.webhook``), for the console or
``ctrlrun approve`` to answer.

The wire format (interface, as the reference writes it):

- the body is compact JSON (``ensure_ascii=False``)::

    {"schema":"ctrlrun.approval_request/v1","request_id":...,"action_hash":...,
     "action":{"name","arguments","principal":{"agent","user"},"resource","environment"},
     "created_at":...,"expires_at":...,"respond_to":...}

  ``respond_to`` (only with ``public_url``) is ``<public_url>/ctrlrun/approvals/<request_id>``;
- the header ``CTRLRun-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>." + body)>``.

Inbound, ``handle_inbound`` checks an answer (``{request_id, action_hash, decision, approver}``)
and records it through ``store.answer_approval``; ``ctrlrun.urls`` serves it as a Django view.
An answer says who answered as a channel string (``slack:U123``): the endpoint verifies the
*sender* (the shared secret), not the person, so under ``approvals_required`` above 1 its answers
count toward no threshold.
"""
from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import ipaddress
import json
import logging
import os
import queue
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .errors import CTRLRunError, InvalidArgument, StateConflict
from .times import evidence_time

__all__ = ["SCHEMA", "SIGNATURE_HEADER", "MIN_SECRET_BYTES", "sign", "verify", "webhook_secret", "request_body",
           "WebhookApprovalProvider", "handle_inbound"]

logger = logging.getLogger("ctrlrun.webhook")

SCHEMA = "ctrlrun.approval_request/v1"
SIGNATURE_HEADER = "CTRLRun-Signature"
#: A shared secret shorter than this is refused: HMAC-SHA256 keys below 32 bytes are guessable in bulk.
MIN_SECRET_BYTES = 32
#: The largest inbound answer read: an answer is four short strings.
MAX_INBOUND_BYTES = 64 * 1024


def _secret_bytes(secret: str | bytes) -> bytes:
    raw = secret.encode() if isinstance(secret, str) else secret
    if not isinstance(raw, bytes) or len(raw) < MIN_SECRET_BYTES:
        raise InvalidArgument(f"a webhook secret must be at least {MIN_SECRET_BYTES} bytes (got "
                              f"{len(raw) if isinstance(raw, bytes) else type(secret).__name__}); make one with "
                              "python -c 'import secrets; print(secrets.token_urlsafe(48))'")
    return raw


def _mac(body: bytes, secret: bytes, at: int) -> str:
    return hmac.new(secret, f"{at}.".encode() + body, hashlib.sha256).hexdigest()


def sign(body: bytes, secret: str | bytes, *, at: int | float | None = None) -> str:
    """The ``CTRLRun-Signature`` header value for ``body`` signed at ``at`` (unix seconds; now by default)."""
    stamp = int(time.time() if at is None else at)
    return f"t={stamp},v1={_mac(body, _secret_bytes(secret), stamp)}"


def verify(header: str | None, body: bytes, secret: str | bytes, window: float = 300, *,
           now: float | None = None) -> bool:
    """Whether ``header`` holds a ``v1`` signature of ``body`` made within ``window`` seconds of
    ``now`` (either side: a sender's clock may run ahead). Constant-time in the signature; a
    malformed header is simply not a valid signature."""
    key = _secret_bytes(secret)
    if not isinstance(header, str) or len(header) > 1024:
        return False
    stamp: int | None = None
    offered: list[str] = []
    for part in header.split(","):
        name, _, value = part.strip().partition("=")
        if name == "t" and value.isascii() and value.isdigit() and len(value) <= 12:
            stamp = int(value)
        elif name == "v1":
            offered.append(value)
    if stamp is None or not offered:
        return False
    moment = time.time() if now is None else now
    if abs(moment - stamp) > window:
        return False
    expected = _mac(body, key, stamp)
    return any(hmac.compare_digest(expected.encode(), value.encode("utf-8", "replace")) for value in offered)


def webhook_secret(path: str | Path | None = None) -> bytes:
    """The shared secret: the file at ``path`` (surrounding whitespace stripped), else
    ``$CTRLRUN_WEBHOOK_SECRET``. Missing, blank, or shorter than 32 bytes is an error."""
    if path is not None:
        try:
            raw = Path(path).read_bytes().strip()
        except OSError as exc:
            raise InvalidArgument(f"cannot read the webhook secret file {path}: {exc.strerror or exc}") from None
        if not raw:
            raise InvalidArgument(f"the webhook secret file {path} is empty")
        return _secret_bytes(raw)
    value = os.environ.get("CTRLRUN_WEBHOOK_SECRET")
    if value is None:
        raise InvalidArgument("no webhook secret: pass a secret file, or set CTRLRUN_WEBHOOK_SECRET")
    if not value.strip():
        raise InvalidArgument("CTRLRUN_WEBHOOK_SECRET is set but empty; unset it or give it a value")
    return _secret_bytes(value.strip())


def _check_url(url: str, allow_insecure: bool) -> str:
    if not isinstance(url, str):
        raise InvalidArgument(f"WebhookApprovalProvider(url=...) must be a URL, got {type(url).__name__}")
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "https" and parts.hostname:
        return url
    if parts.scheme == "http" and parts.hostname:
        if not allow_insecure:
            raise InvalidArgument(f"the webhook URL {url!r} is not https; approvals are not sent in clear "
                                  "(allow_insecure=True permits http to a loopback address, for tests)")
        if not _loopback(parts.hostname):
            raise InvalidArgument(f"the webhook URL {url!r} is http to a host that is not loopback; "
                                  "allow_insecure only permits http to 127.0.0.1, ::1 or localhost")
        return url
    raise InvalidArgument(f"the webhook URL {url!r} is not an https URL with a host")


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def request_body(view: Any, public_url: str | None = None) -> bytes:
    """The exact bytes delivered (and signed) for a recorded request (an ``ApprovalView``)."""
    action = view.canonical_action
    document: dict[str, Any] = {
        "schema": SCHEMA,
        "request_id": view.approval_id,
        "action_hash": view.action_hash,
        "action": {"name": action["name"], "arguments": action["arguments"],
                   "principal": {"agent": action["principal"]["agent"], "user": action["principal"]["user"]},
                   "resource": action.get("resource"), "environment": action.get("environment")},
        "created_at": evidence_time(view.created_at),
        "expires_at": evidence_time(view.expires_at),
    }
    if public_url:
        document["respond_to"] = f"{public_url.rstrip('/')}/ctrlrun/approvals/{view.approval_id}"
    return json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode()


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # a 3xx is then an HTTPError: refused, never followed


_OPENER = urllib.request.build_opener(_NoRedirects)


class WebhookApprovalProvider:
    """Approval requests announced to a webhook; answers come back through ``handle_inbound``.

    ``url`` must be https (http only to loopback with ``allow_insecure``); ``secret`` at least 32
    bytes; ``retries`` further attempts after the first, waiting ``backoff`` seconds, doubling.
    ``delivered`` lists ``(request_id, status)`` of each finished delivery (``"delivered"`` or
    ``"failed"``); ``drain(timeout)`` waits for the deliveries queued so far.
    """

    def __init__(self, *, url: str, secret: str | bytes, timeout: float = 10, retries: int = 2,
                 backoff: float = 1, replay_window: float = 300, public_url: str | None = None,
                 allow_insecure: bool = False, clock: Callable[[], float] | None = None,
                 poll_interval: float | None = None) -> None:
        from .approvals import LocalApprovalProvider

        self.url = _check_url(url, allow_insecure)
        self.secret = _secret_bytes(secret)
        for name, value in (("timeout", timeout), ("backoff", backoff), ("replay_window", replay_window)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise InvalidArgument(f"WebhookApprovalProvider({name}=...) must be a positive number of seconds, "
                                      f"got {value!r}")
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise InvalidArgument(f"WebhookApprovalProvider(retries=...) must be a whole number, 0 or more, got {retries!r}")
        if public_url is not None:
            _check_url(public_url, True)
        self.timeout, self.retries, self.backoff = timeout, retries, backoff
        self.replay_window, self.public_url = replay_window, public_url
        self.clock = clock or time.time
        self._local = LocalApprovalProvider(poll_interval=poll_interval)
        self.poll_interval = self._local.poll_interval
        self.delivered: list[tuple[str, str]] = []
        self._queue: queue.Queue[tuple[str, bytes]] = queue.Queue()
        self._worker: threading.Thread | None = None
        self._lock = threading.Lock()

    def request(self, call: Any, ttl: dt.timedelta) -> Any:
        view = self._local.request(call, ttl)  # recorded (and committed) first
        self._queue.put((view.approval_id, request_body(view, self.public_url)))
        with self._lock:
            if self._worker is None or not self._worker.is_alive():
                self._worker = threading.Thread(target=self._deliver_all, name="ctrlrun-webhook", daemon=True)
                self._worker.start()
        return view

    def check(self, request_id: str) -> Any:
        return self._local.check(request_id)

    def drain(self, timeout: float = 30) -> bool:
        """Wait until every delivery queued so far has finished; False if ``timeout`` ran out first."""
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    def _deliver_all(self) -> None:
        while True:
            try:
                request_id, body = self._queue.get(timeout=5)
            except queue.Empty:
                return
            try:
                self.delivered.append((request_id, "delivered" if self._deliver(request_id, body) else "failed"))
            finally:
                self._queue.task_done()

    def _deliver(self, request_id: str, body: bytes) -> bool:
        wait = self.backoff
        for attempt in range(1, self.retries + 2):
            problem = self._post(body)
            if problem is None:
                logger.info("approval request %s delivered to %s", request_id, self.url)
                return True
            logger.warning("approval request %s: delivery %d of %d to %s failed: %s", request_id, attempt,
                           self.retries + 1, self.url, problem)
            if attempt <= self.retries:
                time.sleep(wait)
                wait *= 2
        logger.error("approval request %s was not delivered to %s; it stays pending for the console or "
                     "`ctrlrun approve %s`", request_id, self.url, request_id)
        return False

    def _post(self, body: bytes) -> str | None:
        headers = {"Content-Type": "application/json", SIGNATURE_HEADER: sign(body, self.secret, at=self.clock())}
        message = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
        try:
            with _OPENER.open(message, timeout=self.timeout) as reply:
                reply.read(1024)
                return None if 200 <= reply.status < 300 else f"HTTP {reply.status}"
        except urllib.error.HTTPError as exc:
            return f"HTTP {exc.code}" + (" (redirects are refused)" if 300 <= exc.code < 400 else "")
        except (urllib.error.URLError, OSError, ValueError) as exc:
            return str(getattr(exc, "reason", exc))


def _refusal(text: str) -> tuple[int, str]:
    return 400, text


def handle_inbound(path_request_id: str, body: bytes, signature: str | None, *, secret: str | bytes,
                   replay_window: float = 300, now: float | None = None) -> tuple[int, str]:
    """Check and record one signed answer; ``(HTTP status, text)``. Every refusal is a 400 and
    changes nothing; the same answer again is ``200 already granted`` (or ``denied``)."""
    from . import store

    if len(body) > MAX_INBOUND_BYTES:
        return _refusal(f"the answer is larger than {MAX_INBOUND_BYTES} bytes")
    if not verify(signature, body, secret, replay_window, now=now):
        return _refusal(f"no valid {SIGNATURE_HEADER} inside the {int(replay_window)} s window")
    try:
        answer = json.loads(body)
    except (ValueError, RecursionError):
        return _refusal("the answer is not valid JSON")
    if not isinstance(answer, dict):
        return _refusal("the answer must be a JSON object {request_id, action_hash, decision, approver}")
    request_id, action_hash = answer.get("request_id"), answer.get("action_hash")
    decision, approver = answer.get("decision"), answer.get("approver")
    if request_id != path_request_id:
        return _refusal("the answer's request_id is not the request in the URL")
    view = store.get_approval(path_request_id) if isinstance(request_id, str) else None
    if view is None:
        return _refusal(f"no approval request {path_request_id!r}")
    if not isinstance(action_hash, str) or not hmac.compare_digest(action_hash.encode(), view.action_hash.encode()):
        return _refusal("the answer's action_hash is not the hash of the action this request is for")
    if decision not in ("grant", "deny"):
        return _refusal("decision must be 'grant' or 'deny'")
    if not isinstance(approver, str) or not approver.strip():
        return _refusal("approver must name who answered (e.g. 'slack:U123')")
    settled = {"grant": "granted", "deny": "denied"}[decision]
    if view.status == settled or (view.status == "consumed" and decision == "grant"):
        return 200, f"already {settled}"
    try:
        answered = store.answer_approval(path_request_id, decision == "grant", by=approver)
    except (StateConflict, InvalidArgument) as exc:
        return _refusal(str(exc))
    except CTRLRunError as exc:
        return _refusal(str(exc))
    if answered.status == "pending":  # M-of-N: the endpoint verifies the sender, not the person
        return 200, f"recorded: {answered.tally}; an unverified endpoint counts toward no threshold"
    return 200, "ok"
