"""``Runtime``: what the kernel reads from the Control a call runs under, named as a protocol.

The steps and drivers never import ``ctrlrun.control``: they are handed an object with these
members (``ctrlrun.Control`` is the one implementation; a test may bring another). Keeping the list
here makes the boundary visible: a new need of the kernel is a new member, added on purpose.
"""
from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

__all__ = ["Runtime"]


@runtime_checkable
class Runtime(Protocol):
    """The members of a Control that ``kernel.steps``, ``kernel.drive`` and ``kernel.decorator`` use."""

    @property
    def store(self) -> Any:
        """The store's façade (``ctrlrun.store``): every read and write of a call goes through it."""

    @property
    def loaded_policy(self) -> Any:
        """The policy when it is read and stored in this Control's database, else None."""

    def load(self) -> Any:
        """Read the policy and store its row (a store phase); returns the ``Policy``."""

    @property
    def identity(self) -> Any:
        """The identity provider (``resolve(IdentityContext) -> Principal | None``), or None."""

    @property
    def lease(self) -> dt.timedelta:
        """The lease a call's effect record is held under, unless its plan names one."""

    @property
    def suspend_timeout(self) -> dt.timedelta:
        """How long a suspended call (``ctrlrun.Suspended``) keeps its key before it lapses."""

    @property
    def poll_interval(self) -> float:
        """Seconds between looks at a pending approval (``wait=True``)."""

    def scope(self) -> contextlib.AbstractContextManager[None]:
        """Entered around every store phase: this Control's database, clock and observers."""

    def bound_scope(self) -> Callable[[], contextlib.AbstractContextManager[Any]] | None:
        """A factory entering that scope from another thread (the lease-renewal thread), or None."""

    def request_approval(self, call: Any) -> Any:
        """Ask the approval provider for a request; returns it."""

    def approval_state(self, request_id: str, last: Any) -> tuple[Any, dt.datetime]:
        """The request as it stands now, and the store's time."""

    @property
    def require_approved_policy(self) -> bool:
        """Whether a call first needs its policy approved (``kernel/approved.py``, §D7)."""

    @property
    def policy_command(self) -> str:
        """How the operator runs the policy command here (``ctrlrun policy``), for the gate's message."""

    def policy_known_approved(self, policy_hash: str) -> bool:
        """Whether this Control already saw ``policy_hash`` approved (on the database it writes to now)."""

    def note_policy_approved(self, policy_hash: str) -> None:
        """Remember that ``policy_hash`` is approved there (a yes is cached; a no is read again)."""
    def verifies_approvers(self) -> bool:
        """Whether something verifies who approves this Control's requests (M-of-N needs it, §D5)."""
