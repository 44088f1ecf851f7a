"""``Control``: everything one protected call is decided and recorded with, as one explicit object.

A Control composes a policy, the database alias of its store, a clock, an approval provider, a
lease, an approval lifetime and observers. ``ctrlrun.protect(...)`` without ``control=`` uses the
*default* Control, built on first use from settings (``CTRLRUN_POLICY``, ``CTRLRUN_DATABASE``,
...); a program that needs more than one - one per tenant or per policy file, a test with a
scripted approver - builds its own and passes ``control=``, or calls it directly with a tool's
name and JSON arguments (``call`` / ``acall``), the entry an agent framework or gateway needs.

What is per Control: the policy (and its stored row, per database), the reconcile hooks
registered for its actions, the database alias and clock its store phases run with
(``scope()``), its approval provider and observers. What is per process: Django's settings and
connections, the lease-renewal thread, and the store threads of async calls.
"""
from __future__ import annotations

import contextlib
import hashlib
import datetime as dt
import inspect
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from . import conf
from .canonical import Principal
from .errors import InvalidArgument
from .kernel import drive
from .kernel.decorator import guarded
from .kernel.plans import plan_for
from .kernel.steps import call_steps
from .kernel.suspension import resume_steps
from .policy import AuthorityDocument, Evaluation, Policy, load_authority, load_policy, parse_policy

__all__ = ["Control", "default_control", "reset_default"]


_NOTHING = contextlib.nullcontext()
_FROM_SETTINGS = object()  # the default Control's identity provider: read from settings on first use
#: How often (seconds, at most) a call looks at the settings' policy files for a change.
_RECHECK_SECONDS = 1.0
_store: Any = None  # ctrlrun.store, once Django is ready (see Control.store)


def _timedelta(value: Any, what: str) -> dt.timedelta | None:
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = dt.timedelta(seconds=value)
    if not isinstance(value, dt.timedelta) or value <= dt.timedelta(0):
        raise InvalidArgument(f"Control({what}=...) must be a positive timedelta (or seconds), got {value!r}")
    return value


#: How long a suspended call keeps its key unless ``Control(suspend_timeout=...)`` says (spec A5).
SUSPEND_TIMEOUT = dt.timedelta(minutes=5)

class Control:
    """The explicit composition a protected call runs under.

    ``policy``: a loaded ``Policy``, or a path to a policy file (read now), or None to read
    ``CTRLRUN_POLICY`` (or ``./ctrlrun.yaml``) on first use. ``database``: the ``DATABASES`` alias
    holding ctrlrun's tables (default: ``CTRLRUN_DATABASE``). ``clock``: a function returning an
    aware UTC datetime, replacing the store's clock for this Control's calls (tests; see
    ``ctrlrun.testing.Clock``). ``approvals``: an approval provider (default: the database's,
    ``LocalApprovalProvider``). ``observers``: objects with ``on_event(event)`` and/or
    ``on_receipt(receipt)``, told what this Control's calls wrote, after each commit.
    ``identity``: an identity provider that says who acts (``ctrlrun.identity``); without one,
    ``ctrlrun.context()`` (or ``call(principal=)``) says. ``approver_identity``: a
    ``ctrlrun.approvers.ApproverIdentity`` when a surface other than the console verifies approvers
    (``ctrlrun mcp-operator``), so M-of-N requests are asked (docs/approvals.md).
    """

    def __init__(self, policy: Policy | str | Path | None = None, *, database: str | None = None,
                 clock: Callable[[], dt.datetime] | None = None, approvals: Any = None,
                 observers: Sequence[Any] = (), lease: dt.timedelta | float | None = None,
                 approval_ttl: dt.timedelta | float | None = None, environment: str | None = None,
                 authority: str | Path | AuthorityDocument | None = None,
                 require_approved_policy: bool | None = None, identity: Any = None,
                 suspend_timeout: dt.timedelta | float | None = None, approver_identity: Any = None) -> None:
        if authority is not None and not isinstance(authority, AuthorityDocument):
            if not isinstance(authority, (str, Path)):
                raise InvalidArgument(f"Control(authority=...) is the path of an authority file (or a parsed "
                                      f"AuthorityDocument), not {type(authority).__name__}")
            authority = load_authority(authority)
        if isinstance(policy, (str, Path)):
            # The deployment's authority file applies to an explicit policy path too (as its environment
            # does): grants configured for this process are never silently left out.
            policy = load_policy(policy, environment=environment or _environment(),
                                 authority=authority or _authority_file())
        elif isinstance(policy, Policy) and (authority is not None or environment is not None and (
                not isinstance(environment, str) or environment.strip() != policy.environment)):
            # A Policy keeps the environment it was parsed with; Control(environment=) ranks above it.
            # The grants it was parsed with (a standalone file) stay with it, unless others are given.
            policy = parse_policy(policy.text, policy.source, environment=environment or policy.environment,
                                  authority=authority or policy.authority_document)
        elif policy is not None and not isinstance(policy, Policy):
            raise InvalidArgument(f"Control(policy=...) must be a Policy or a path to a policy file, not "
                                  f"{type(policy).__name__}")
        if database is not None:
            _check_database(database)
        if clock is not None:
            _check_clock(clock)
        if approvals is not None and not (callable(getattr(approvals, "request", None))
                                          and callable(getattr(approvals, "check", None))):
            raise InvalidArgument(f"Control(approvals=...): {approvals!r} is not an approval provider (it needs "
                                  f"request(call, ttl) and check(request_id); see ctrlrun.approvals)")
        for observer in observers:
            if not (callable(getattr(observer, "on_event", None)) or callable(getattr(observer, "on_receipt", None))):
                raise InvalidArgument(f"Control(observers=...): {observer!r} has neither on_event() nor on_receipt()")
        if require_approved_policy is not None and not isinstance(require_approved_policy, bool):
            raise InvalidArgument(f"Control(require_approved_policy=...) must be True or False (None: the "
                                  f"CTRLRUN_REQUIRE_APPROVED_POLICY setting), got {require_approved_policy!r}")
        self._require_approved = require_approved_policy
        self._approved_policies: set[tuple[str, str]] = set()  # (database alias, policy hash) seen approved
        self._identity = _identity_provider(identity)
        if approver_identity is not None:
            from .approvers import ApproverIdentity

            if not isinstance(approver_identity, ApproverIdentity):
                raise InvalidArgument(f"Control(approver_identity=...) takes a ctrlrun.approvers.ApproverIdentity"
                                      f"(provider, roles_claim=...), got {type(approver_identity).__name__}")
            if approver_identity.provider is self._identity and identity is not None:
                raise InvalidArgument("Control(approver_identity=...) must not use the agents' identity provider: "
                                      "whoever can act as an agent could then vouch for an approver")
        #: How approvers are verified outside the console (§D4), or None.
        self.approver_identity = approver_identity
        self._policy: Policy | None = policy
        #: Whether the policy comes from settings' files (read again when they change), not given here.
        self._from_settings = policy is None
        self._read_key: Any = None  # the files' identity the settings' policy was read from
        self._checked_at = 0.0  # time.monotonic() when a call last looked at the files
        self._read_lock = threading.Lock()
        self._environment = environment
        self._authority = authority
        self._database = database
        self._clock = clock
        self._approvals = approvals
        self._observers = tuple(observers)
        self._lease = _timedelta(lease, "lease")
        self._suspend_timeout = _timedelta(suspend_timeout, "suspend_timeout")
        self._approval_ttl = _timedelta(approval_ttl, "approval_ttl")
        self._stored: set[str] = set()  # database aliases holding this policy's row
        self._lock = threading.Lock()
        #: Reconcile hooks of this Control's actions, by action name.
        self.hooks: dict[str, Callable[[str], Any]] = {}

    @classmethod
    def from_file(cls, path: str | Path | None = None, *, environment: str | None = None, **options: Any) -> Control:
        """A Control whose policy is read from ``path`` (default: ``CTRLRUN_POLICY``, else
        ``./ctrlrun.yaml``) now, so a broken file fails here, before any call. Without ``path`` the
        settings' policy comes with the settings' authority file (``CTRLRUN_AUTHORITY``), as the
        default Control's does: grants configured there are never left unenforced."""
        if path is None:
            from . import standalone

            standalone.configure_settings()
            path = conf.policy_path()
            if options.get("authority") is None:
                options["authority"] = conf.authority_path()
        return cls(Path(path), environment=environment, **options)

    def __repr__(self) -> str:
        source = self._policy.source if self._policy is not None else "settings"
        return f"<Control policy={source!r} database={self.database!r}>"

    # ------------------------------------------------------------------ composition

    @property
    def store(self) -> Any:
        """The store's façade (``ctrlrun.store``), imported on first use: Django must be set up first."""
        global _store
        if _store is None:
            from . import store

            _store = store
        return _store

    @property
    def database(self) -> str:
        return self._database or conf.database_alias()

    @property
    def clock(self) -> Callable[[], dt.datetime] | None:
        return self._clock

    @property
    def approvals(self) -> Any:
        if self._approvals is None:
            from .approvals import LocalApprovalProvider

            self._approvals = LocalApprovalProvider()
        return self._approvals

    @property
    def observers(self) -> tuple[Any, ...]:
        return self._observers

    @property
    def identity(self) -> Any:
        """The identity provider that says who acts (``Control(identity=...)``; see ``ctrlrun.identity``),
        or None: then ``ctrlrun.context()`` says. The default Control's is ``CTRLRUN_IDENTITY_PROVIDER``."""
        if self._identity is _FROM_SETTINGS:
            from django.conf import settings

            if not settings.configured:
                return None
            self._identity = _identity_provider(conf.identity_provider())
        return self._identity

    @property
    def lease(self) -> dt.timedelta:
        return self._lease or conf.lease()

    @property
    def suspend_timeout(self) -> dt.timedelta:
        """How long a suspended call keeps its key (``ctrlrun.Suspended``; default 5 minutes)."""
        return self._suspend_timeout or SUSPEND_TIMEOUT

    @property
    def approval_ttl(self) -> dt.timedelta:
        return self._approval_ttl or conf.approval_ttl()

    @property
    def require_approved_policy(self) -> bool:
        """Whether every call first needs its policy approved (§D7): ``Control(require_approved_policy=)``,
        else the ``CTRLRUN_REQUIRE_APPROVED_POLICY`` setting (default False). Never in the policy file."""
        if self._require_approved is not None:
            return self._require_approved
        return conf.require_approved_policy()

    @property
    def policy_command(self) -> str:
        from .messages import command

        return command("policy").strip("'").split("' (or")[0]

    def policy_known_approved(self, policy_hash: str) -> bool:
        return (self._alias_now(), policy_hash) in self._approved_policies

    def note_policy_approved(self, policy_hash: str) -> None:
        self._approved_policies.add((self._alias_now(), policy_hash))

    def read_candidate(self, candidate: Policy | str | Path, *, source: str | None = None) -> Policy:
        """A candidate policy (a path, or a Policy; with ``source``, ``candidate`` is its text) read as
        this Control would read it once installed: the same environment override and standalone
        authority file, so its hash is the one it will have in force (§D7). Stores nothing."""
        current = self._read()
        environment, authority = self._environment or _environment(), current.authority_document
        if source is not None:
            if not isinstance(candidate, str):
                raise InvalidArgument(f"a candidate policy's text must be a str, not {type(candidate).__name__}")
            return parse_policy(candidate, source, environment=environment, authority=authority)
        if isinstance(candidate, Policy):
            return parse_policy(candidate.text, candidate.source, environment=environment, authority=authority)
        if isinstance(candidate, (str, Path)):
            return load_policy(candidate, environment=environment, authority=authority)
        raise InvalidArgument(f"a candidate policy is a path or a Policy, not {type(candidate).__name__}")

    def _propose_policy(self, candidate: Policy | str | Path, *, approval: str | None = None,
                        principal: Principal | str | None = None) -> Any:
        """Propose ``candidate`` (a policy file, or its text) as this Control's next policy (§D7): the
        protected action ``ctrlrun.policy.change``, decided by the policy in force. Returns the
        proposal's result ``{"approved": <hash>}`` once an approval was presented and used; raises
        ``ApprovalRequired`` first. The file is not installed. See ``ctrlrun.proposals``."""
        from . import proposals

        return proposals.propose(self, candidate, approval=approval, principal=principal)

    @property
    def poll_interval(self) -> float:
        return float(getattr(self.approvals, "poll_interval", None) or conf.approval_poll().total_seconds())

    @property
    def given_policy(self) -> Policy | None:
        """The policy already in memory (given, or read before), without reading anything: what
        decorating a function checks its templates against."""
        return self._policy

    @property
    def loaded_policy(self) -> Policy | None:
        """The policy, once it is loaded and stored in this Control's database (else None). A policy
        from settings whose files changed since they were read (looked at once a second at most: a
        call sees an edited file within a second) is not loaded: ``load`` reads it again."""
        policy = self._policy
        if policy is None or not self._stored or self._alias_now() not in self._stored:
            return None
        if self._from_settings:
            now = time.monotonic()
            if now - self._checked_at >= _RECHECK_SECONDS:  # the files are read at most once a second
                self._checked_at = now
                if self._settings_key() != self._read_key:
                    return None
        return policy

    def _alias_now(self) -> str:
        """The database this Control's next phase writes to: its own, else the store's here and now
        (a ``store.using()`` block, else ``CTRLRUN_DATABASE``)."""
        if self._database is not None:
            return self._database
        return self.store.alias()

    @property
    def policy(self) -> Policy:
        """The policy (loading it, and storing its row, if this is the first use)."""
        return self.loaded_policy or self.load()

    def read_policy(self) -> Policy:
        """The policy this Control decides by, read without touching the store: what a page or a
        command that only reads needs (its mode, its actions, its grants). This is the one reader of
        the configured policy: a Control built from settings (the default one) reads the settings'
        policy file and authority file again when either changed (its path or its bytes),
        so the console, the commands and the calls of one process describe the same policy. A policy
        that cannot be read raises its ``PolicyError``; nothing is cached then."""
        return self._read()

    def scope(self) -> contextlib.AbstractContextManager[None]:
        """Store calls inside the block use this Control's database, clock and observers (a Control
        with none of its own - the default - changes nothing, at no cost: this runs for every phase)."""
        if self._database is None and self._clock is None and not self._observers:
            return _NOTHING
        return self._own_scope()

    def bound_scope(self) -> Callable[[], contextlib.AbstractContextManager[Any]] | None:
        """A factory that enters, from any thread, the database and clock this Control's phases use
        here and now (its own, or the caller's ``store.using`` block's): the lease-renewal thread
        renews the record where it was written. None when that is the process's default anyway."""
        alias = self._alias_now()
        if self._clock is None and self._database is None and alias == conf.database_alias():
            return None
        store, clock = self.store, self._clock

        def enter() -> contextlib.AbstractContextManager[Any]:
            stack = contextlib.ExitStack()
            stack.enter_context(store.using(alias))
            stack.enter_context(conf.scoped_clock(clock))
            return stack

        return enter

    @contextlib.contextmanager
    def _own_scope(self) -> Iterator[None]:
        from . import observers, store

        with contextlib.ExitStack() as stack:
            if self._database is not None:
                stack.enter_context(store.using(self._database))
            stack.enter_context(conf.scoped_clock(self._clock))
            stack.enter_context(observers.observing(self._observers))
            yield

    @property
    def policy_hash(self) -> str:
        return self._read().hash

    def _settings_key(self) -> Any:
        """What identifies the settings' policy as it stands now: the paths and contents of the policy
        file and the authority file, and the environment."""
        from . import standalone

        standalone.configure_settings()
        path = conf.policy_path()
        authority = self._authority if self._authority is not None else conf.authority_path()
        return (_file_key(path), authority if isinstance(authority, AuthorityDocument) else
                _file_key(authority) if authority is not None else None, self._environment or _environment())

    def _read(self) -> Policy:
        """The policy: the one given, or the settings' as their files are now (nothing touches the store)."""
        if not self._from_settings:
            return self._policy  # type: ignore[return-value]
        key = self._settings_key()
        if self._policy is not None and key == self._read_key:
            return self._policy
        with self._read_lock:
            if self._policy is None or key != self._read_key:
                (path, _), authority, environment = key
                policy = load_policy(path, environment=environment, authority=authority if authority is None or
                                     isinstance(authority, AuthorityDocument) else authority[0])
                if self._policy is None or policy.hash != self._policy.hash:
                    self._stored = set()  # a new policy: its row is stored before its first decision
                self._policy, self._read_key = policy, key
        return self._policy

    def load(self) -> Policy:
        """Read the policy (if not given), make the store ready, store the policy's row. Idempotent."""
        from . import standalone

        with self._lock:
            policy = self._read()  # the policy first: a broken one creates nothing
            standalone.ensure_ready()
            alias = self._alias_now()
            if alias not in self._stored:
                with self.scope():
                    grants = policy.authority_document
                    if grants is not None:  # the grants' own text is kept too, under its own identity
                        self.store.ensure_policy(grants.hash, grants.schema, f"authority file {grants.source}",
                                                 grants.text, policy.environment)
                    self.store.ensure_policy(policy.hash, policy.schema, policy.source if grants is None else
                                             f"{policy.source}, with the grants of {grants.source} ({grants.hash})",
                                             policy.text, policy.environment)
                self._stored.add(alias)
        return policy

    # ------------------------------------------------------------------ approvals (store phases)

    def request_approval(self, call: Any) -> Any:
        return self.approvals.request(call, self.approval_ttl)

    def verifies_approvers(self) -> bool:
        """Whether a surface verifies who approves this Control's requests (§D5): an
        ``approver_identity`` given to it, or ctrlrun's console in this Django project."""
        return getattr(self, "approver_identity", None) is not None or conf.console_verifies()

    def approval_state(self, request_id: str, last: Any) -> tuple[Any, dt.datetime]:
        """The request as it stands (or ``last``, if the provider cannot say), and the store's time."""
        return self.approvals.check(request_id) or last, self.store.now()

    def read(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` - a ``ctrlrun.store`` read such as ``store.get_approval`` - on this
        Control's database and clock (and the caller's ``store.using`` block, if it has none)."""
        self.policy  # noqa: B018 - the store is ready (a plain script's first use configures it)
        with self.scope():
            return fn(*args, **kwargs)

    async def aread(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``read`` from an event loop: run on ctrlrun's store threads, never on the loop."""
        from .kernel.steps import Phase

        if self.loaded_policy is None:
            await drive.run_phase(self, Phase(self.load))
        return await drive.run_phase(self, Phase(fn, args, kwargs))

    # ------------------------------------------------------------------ delegation (authority, §C3)

    def delegate(self, parent_id: str, grant: Any, *, by: Principal | str, via: str = "api") -> Any:
        """Hand a narrower grant down from ``parent_id`` (a delegable grant of the policy's
        ``authority:``, or a delegation ``dlg_...``) to the grant's subject; ``by`` is who delegates
        (it must be the parent's subject). ``grant`` is a ``Grant`` with ``id=""``, or one grant
        document (YAML text) without ``id``. Returns the ``Delegation``; refused with
        ``AuthorityEscalation(reason, parent_id, dimension)`` (recorded as ``DELEGATION_REJECTED``)."""
        if via not in ("api", "cli"):  # a hop is made by hop(); break-glass envelopes are not built
            raise InvalidArgument(f"delegate(via=...) is 'api' or 'cli', not {via!r}")
        return self._delegate(parent_id, grant, by=by, via=via)

    def hop(self, parent_id: str, grant: Any, *, by: Principal | str, action_id: str | None = None) -> Any:
        """A delegation made for another agent to present with its calls (``protect(hop=...)``,
        ``call(hop=...)``): under a hop, that delegation is the only grant that counts (the agent's
        own grants do not widen it) and its chain's budgets pay. ``action_id`` names the call that
        handed it over, for the record. Refused as ``delegate`` is."""
        if action_id is not None and (not isinstance(action_id, str) or not action_id):
            raise InvalidArgument("hop(action_id=...) names the call that handed the hop over, or is None")
        return self._delegate(parent_id, grant, by=by, via="hop", action_id=action_id)

    def _delegate(self, parent_id: str, grant: Any, *, by: Principal | str, via: str,
                  action_id: str | None = None) -> Any:
        from .policy.authority import Grant
        from .errors import AuthorityEscalation
        from .policy import parse_grant

        policy = self.policy
        if policy.authority is None:
            raise InvalidArgument(f"{policy.source} has no 'authority:' section: there is nothing to delegate from")
        if isinstance(by, str):
            by = Principal(agent=by)
        if not isinstance(by, Principal):
            raise InvalidArgument(f"delegate(by=...) must be a ctrlrun.Principal or an agent name, not "
                                  f"{type(by).__name__}")
        if not isinstance(parent_id, str) or not parent_id:
            raise InvalidArgument("delegate(parent_id=...) must name a grant or a delegation")
        if isinstance(grant, str):
            grant = parse_grant(grant)
        elif isinstance(grant, Grant):
            if grant.id:
                raise InvalidArgument(f"a delegated grant has no id (got {grant.id!r}): ctrlrun names each "
                                      f"delegation (dlg_...); pass Grant(id='', ...)")
            from .policy import grant_from_json, grant_json

            try:  # validated exactly as a stored one is read back
                grant = grant_from_json(grant_json(grant), "")
            except ValueError as exc:
                raise InvalidArgument(f"delegate(grant=...): {exc}") from None
        else:
            raise InvalidArgument(f"delegate(grant=...) must be a ctrlrun Grant or a grant document (YAML text), "
                                  f"not {type(grant).__name__}")
        with self.scope():
            if by.expires_at is not None and by.expired(self.store.now()):  # rule 0: an expired credential
                from .errors import IdentityError
                from .identity import expired_message

                raise IdentityError(expired_message("delegate", by))
            made = self.store.create_delegation(policy.authority, parent_id, grant, agent=by.agent, user=by.user,
                                                via=via, action_id=action_id)
        if isinstance(made, self.store.delegations.Rejected):
            raise AuthorityEscalation(f"{made.reason}: {made.message}", reason=made.reason, parent_id=parent_id,
                                      dimension=made.dimension)
        return made

    def revoke(self, delegation_id: str, *, by: Principal | str | None = None) -> Any:
        """Revoke a delegation, and so every delegation beneath it from the next evaluation on.
        Idempotent: revoking a revoked one changes nothing. Returns the store's ``Revoked``
        (``.delegation``, ``.changed``); an unknown id is ``InvalidArgument``."""
        if isinstance(by, Principal):
            by = by.agent + (f"/{by.user}" if by.user else "")
        by = by if by is not None else "api"
        if not isinstance(by, str) or not by.strip():
            raise InvalidArgument("revoke(by=...) must name who revokes")
        self.policy  # noqa: B018 - the store is ready
        with self.scope():
            done = self.store.revoke_delegation(delegation_id, by)
        if done is None:
            raise InvalidArgument(f"no delegation {delegation_id!r}")
        return done

    # ------------------------------------------------------------------ hooks

    def register_hook(self, action: str, hook: Callable[[str], Any]) -> None:
        self.hooks[action] = hook

    def hook_for(self, action: str) -> Callable[[str], Any] | None:
        return self.hooks.get(action)

    # ------------------------------------------------------------------ entry points

    def protect(self, name: str, **options: Any) -> Callable[[Any], Any]:
        """``ctrlrun.protect(name, ..., control=self)``: the options are ``protect``'s."""
        return guarded(plan_for(name, options), runtime=lambda: self, hooks=self.hooks, policy=self.given_policy)

    def evaluate(self, name: str, arguments: Mapping[str, Any]) -> Evaluation:
        """What the policy says about ``name`` with these arguments; writes nothing."""
        from .canonical import canonical_arguments

        return self._read().evaluate(name, canonical_arguments(_arguments(name, arguments)))

    def call(self, name: str, arguments: Mapping[str, Any], executor: Callable[[], Any], *,
             principal: Principal | str | None = None, headers: Mapping[str, str] | None = None,
             **options: Any) -> Any:
        """Guard one call of ``name`` with JSON ``arguments``: the policy decides, the effect key
        dedupes, ``executor()`` (no arguments) acts. Returns what the executor returns.

        ``principal`` is who acts (a ``Principal`` or an agent name; default: ``ctrlrun.context()``).
        ``headers`` are the request's (a gateway's): only the identity provider reads them, and
        without one they mean nothing. ``options`` are ``protect``'s: ``effect``, ``resource``,
        ``lease``, ``reconcile``, ``reconcile_eagerly``, ``wait``, ``task``, ``scope``, ``hop``,
        ``preconditions``.
        """
        return drive.run_sync(self._steps(name, arguments, executor, principal, options, asynchronous=False,
                                          headers=headers), self)

    async def acall(self, name: str, arguments: Mapping[str, Any], executor: Callable[[], Any], *,
                    principal: Principal | str | None = None, headers: Mapping[str, str] | None = None,
                    **options: Any) -> Any:
        """``call`` from an event loop: the executor may be ``async def`` (awaited) or a plain
        function (run in a thread); the store is never waited on in the loop."""
        return await drive.run_async(self._steps(name, arguments, executor, principal, options, asynchronous=True,
                                                 headers=headers), self)

    def resume(self, continuation: str | bytes, executor: Callable[[], Any]) -> Any:
        """Finish the call suspended under ``continuation`` (spec A5): the same action and attempt,
        its outcome recorded as a call's; the executor's value is returned. A continuation resumes
        once: a second resume, an unknown token or a lapsed suspension is ``InvalidArgument``."""
        return drive.run_sync(self._resume_steps(continuation, executor, asynchronous=False), self)

    async def aresume(self, continuation: str | bytes, executor: Callable[[], Any]) -> Any:
        """``resume`` from an event loop: the executor may be ``async def``."""
        return await drive.run_async(self._resume_steps(continuation, executor, asynchronous=True), self)

    def _resume_steps(self, continuation: Any, executor: Callable[[], Any], *, asynchronous: bool) -> Any:
        if not isinstance(continuation, (str, bytes)) or not continuation:
            raise InvalidArgument("resume: the continuation is the non-empty str or bytes the executor raised "
                                  "ctrlrun.Suspended with")
        if not callable(executor):
            raise InvalidArgument(f"resume: the executor must be callable (a function of no arguments), not "
                                  f"{type(executor).__name__}")
        awaitable = inspect.iscoroutinefunction(executor)
        if awaitable and not asynchronous:
            raise InvalidArgument("resume: the executor is an 'async def'; use 'await control.aresume(...)'")
        return resume_steps(self, continuation, lambda action: executor(), awaitable=awaitable)

    def _steps(self, name: str, arguments: Mapping[str, Any], executor: Callable[[], Any],
               principal: Principal | str | None, options: dict[str, Any], *, asynchronous: bool,
               headers: Mapping[str, str] | None = None) -> Any:
        plan = plan_for(name, options)
        if headers is not None and not (isinstance(headers, Mapping) and all(
                isinstance(k, str) and isinstance(v, str) for k, v in headers.items())):
            raise InvalidArgument(f"{name}: headers must be a mapping of header name to text value")
        if not callable(executor):
            raise InvalidArgument(f"{name}: the executor must be callable (a function of no arguments), "
                                  f"not {type(executor).__name__}")
        if inspect.isgeneratorfunction(executor) or inspect.isasyncgenfunction(executor):
            raise InvalidArgument(f"{name}: the executor is a generator; give a plain function")
        if isinstance(principal, str):
            if not principal.strip():
                raise InvalidArgument(f"{name}: principal must name the agent that acts")
            principal = Principal(agent=principal)
        elif principal is not None and not isinstance(principal, Principal):
            raise InvalidArgument(f"{name}: principal must be a ctrlrun.Principal or an agent name, not "
                                  f"{type(principal).__name__}")
        given = _arguments(name, arguments)
        awaitable = inspect.iscoroutinefunction(executor)
        if awaitable and not asynchronous:
            raise InvalidArgument(f"{name}: the executor is an 'async def'; use 'await control.acall(...)'")
        if plan.reconcile is not None:
            # Deferred reconciliation (reconcile.run_once(control=...)) finds the hook by action name.
            self.register_hook(name, plan.reconcile)
        return call_steps(self, plan, lambda: given, lambda action: executor(), awaitable=awaitable,
                          principal=principal, headers=headers)


def _identity_provider(identity: Any) -> Any:
    from .identity import check_provider

    return check_provider(identity)


def _check_database(database: Any) -> None:
    if not isinstance(database, str) or not database.strip():
        raise InvalidArgument("Control(database=...) must name an entry of settings.DATABASES")
    from django.db import connections

    from . import standalone

    standalone.configure_settings()
    if database not in connections.settings:
        raise InvalidArgument(f"Control(database={database!r}): settings.DATABASES has no such entry (it has "
                              f"{', '.join(sorted(connections.settings))}); add it, and run 'python manage.py "
                              f"migrate --database {database}'")


def _check_clock(clock: Any) -> None:
    if not callable(clock):
        raise InvalidArgument("Control(clock=...) must be a function returning the current time")
    now = clock()
    if not isinstance(now, dt.datetime) or now.tzinfo is None or now.utcoffset() is None:
        raise InvalidArgument(f"Control(clock=...) must return an aware datetime (e.g. datetime.now(timezone.utc)), "
                              f"got {now!r}")


def _arguments(name: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
    if not isinstance(arguments, Mapping):
        raise InvalidArgument(f"{name}: arguments must be a mapping of names to JSON values, not "
                              f"{type(arguments).__name__}")
    for key in arguments:
        if not isinstance(key, str) or not key:
            raise InvalidArgument(f"{name}: argument names must be non-empty strings, got {key!r}")
        if key == "data_scope":
            raise InvalidArgument(f"{name}: 'data_scope' is reserved and cannot be an argument name")
    return dict(arguments)


def _file_key(path: Path) -> tuple[Path, str | None]:
    """A file's path with a digest of its bytes (None when it cannot be read: loading it says why).
    The bytes, not the modification time: two writes within one clock tick differ here too."""
    try:
        return path, hashlib.blake2b(path.read_bytes(), digest_size=16).hexdigest()
    except (OSError, ValueError):
        return path, None


def _authority_file() -> Path | None:
    """The deployment's standalone authority file (``CTRLRUN_AUTHORITY``), if it names one."""
    from . import standalone

    standalone.configure_settings()
    return conf.authority_path()


def _environment() -> str | None:
    """The deployment's environment if it names one (the policy's own ``environment:`` ranks below)."""
    from . import standalone

    standalone.configure_settings()
    return conf.environment_override()


#: Reconcile hooks of the default Control's actions, by action name: the process-wide registry that
#: ``protect`` (without ``control=``) fills as modules are imported.
PROCESS_HOOKS: dict[str, Callable[[str], Any]] = {}

_default: Control | None = None
_default_lock = threading.Lock()


def default_control() -> Control:
    """The process-wide Control behind ``protect(...)`` without ``control=`` (built on first use)."""
    global _default
    if _default is None:
        with _default_lock:
            if _default is None:
                control = Control()
                control._identity = _FROM_SETTINGS  # CTRLRUN_IDENTITY_PROVIDER, read on first use
                control.hooks = PROCESS_HOOKS  # the decorators' registry, filled at import time
                _default = control
    return _default


def reset_default() -> None:
    """Forget the default Control (its policy is read again on the next call)."""
    global _default
    _default = None

