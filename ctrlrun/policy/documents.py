"""Entry points: policy and authority documents parsed from text or loaded from files, their
hash, and grants as JSON. No Django."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import gc
import os
import types
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..canonical import DEFAULT_ENVIRONMENT, canonical_bytes, sha256_hash
from ..errors import InvalidArgument, PolicyError
from .authority import Authority, Grant
from .loader import MAX_POLICY_BYTES, load_yaml, policy_error, size_error, type_name
from .model import Policy
from .reader import Reader
from .schema import NEWEST_SUPPORTED, SCHEMA_VERSION


def policy_hash(schema: str, actions: Any, environment: str, *, mode: str = "enforce",
                controls: Any = None, authority: Any = None) -> str:
    """§1.7: the hash of what decides calls: the actions and the ``controls:`` registry as written,
    the authority enforced (none yet), the resolved environment, the mode and the schema.
    ``version:`` is left out: relabelling a policy does not change what it decides."""
    return sha256_hash(
        canonical_bytes(
            {
                "actions": actions,
                "authority": authority,
                "controls": controls,
                "environment": environment,
                "mode": mode,
                "schema": schema,
            }
        )
    )


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a policy is built.

    Loading allocates a few objects per node and frees almost nothing until the end, which is
    the collector's worst case: on a policy of MAX_POLICY_BYTES it would take about half of the
    time. Reference counting still frees everything that is dropped; the collector is switched
    back on afterwards unless it was already off, as the caller's choice.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@dataclass(frozen=True)
class AuthorityDocument:
    """A standalone authority file (§C2): exactly ``schema`` and ``authority``, kept apart from the
    policy so that who writes grants need not be who writes rules. Its grants hash as an inline
    section's would."""

    authority: Authority
    schema: str
    source: str
    text: str

    @property
    def hash(self) -> str:
        """The document's own identity (what the store keeps it under)."""
        return sha256_hash(canonical_bytes({"authority": self.authority.canonical(), "schema": self.schema,
                                            "standalone": True}))


def parse_authority(text: str, source: str = "<authority>") -> AuthorityDocument:
    """Validate a standalone authority document: ``schema`` (v3 or later) and ``authority`` only."""
    if not isinstance(text, str):
        raise InvalidArgument(f"an authority document must be text (str), not {type(text).__name__}")
    source = str(source)
    reader = Reader(source)
    with _collector_paused():
        document = load_yaml(text, source)
        if not isinstance(document, dict):
            reader.fail(getattr(document, "line", None), "top level",
                        f"an authority document is a mapping with 'schema' and 'authority', got {type_name(document)}")
        reader.check_values(document, "", document.line, set())
        reader.read_schema(document)
        for key in document:
            if key in ("actions", "mode", "environment", "controls", "version"):
                reader.fail(document.key_lines[key], "top level",
                            f"'{key}' belongs in the policy file: an authority document holds only 'schema' and "
                            f"'authority'")
        reader.check_keys(document, {"schema": 1, "authority": 3}, document.line, "top level")
        if "authority" not in document:
            reader.fail(document.line, "top level", "an authority document needs an 'authority' section")
        section = document["authority"]
        if isinstance(section, dict) and "break_glass" in section:
            reader.fail(section.key_lines["break_glass"], "authority",
                        "'break_glass' cannot be in a standalone authority document: its envelopes cite the "
                        "policy's controls, which this document cannot see")
        authority = reader.read_authority(section, document.key_lines["authority"])
    return AuthorityDocument(authority, reader.schema, source, text)


def _read_text(path: str | os.PathLike[str], what: str) -> tuple[str, str]:
    """The text of a policy-sized file (refused over MAX_POLICY_BYTES before reading it all)."""
    source = os.fspath(path)
    try:
        with open(source, "rb") as handle:
            # Never read more than the limit: a huge file (or /dev/zero) is refused by its size.
            size = os.fstat(handle.fileno()).st_size
            if size > MAX_POLICY_BYTES:
                raise size_error(str(source), f"the {what} file is {size:,} bytes")
            data = handle.read(MAX_POLICY_BYTES + 1)
        if len(data) > MAX_POLICY_BYTES:
            raise size_error(str(source), f"the {what} file is more than {MAX_POLICY_BYTES:,} bytes")
        # Universal newlines, as reading in text mode gives: the stored text is the same.
        return str(source), data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")
    except (OSError, UnicodeDecodeError) as exc:
        # The one message that does not start with "<source>:": the spec's wording, and the
        # path is in it anyway.
        error = PolicyError(f"{what} file {source} could not be read: {exc}")
        error.source, error.line, error.location = str(source), None, ""  # type: ignore[attr-defined]
        raise error from None


def load_authority(path: str | os.PathLike[str]) -> AuthorityDocument:
    """Read and parse a standalone authority file."""
    return parse_authority(*reversed(_read_text(path, "authority")))


def parse_policy(text: str, source: str = "<string>", *, environment: str | None = None,
                 authority: AuthorityDocument | None = None) -> Policy:
    """Validate a policy document and return the :class:`Policy`; PolicyError names what is wrong.

    ``environment`` is the caller's explicit environment (``Control(environment=)``, else the
    ``CTRLRUN_ENVIRONMENT`` setting or variable), or None: then the document's own
    ``environment:`` (v3) applies, else ``production``. The resolved value is part of the hash
    and of every action, because rules approved for staging are not an approval for production.
    ``authority`` is a standalone authority document (§C2) to enforce with it; a policy with its
    own ``authority:`` section cannot take one as well.
    """
    if not isinstance(text, str):
        raise InvalidArgument(f"a policy must be text (str), not {type(text).__name__}")
    if environment is not None and (not isinstance(environment, str) or not environment.strip()):
        raise InvalidArgument(f"environment must be a non-empty string, got {environment!r}")
    source = str(source)
    reader = Reader(source)
    with _collector_paused():
        read = reader.read(load_yaml(text, source))
        if authority is not None:
            if read.authority is not None:
                reader.fail(None, "top level",
                            f"this policy has its own 'authority:' section and {authority.source} declares one "
                            f"too: keep the grants in one place (remove the section, or the authority file)")
            read.authority = authority.authority
        resolved = environment.strip() if environment is not None else read.environment or DEFAULT_ENVIRONMENT
        try:
            digest = policy_hash(read.schema, read.raw_actions, resolved, mode=read.mode, controls=read.raw_controls,
                                 authority=read.authority.canonical() if read.authority is not None else None)
        except InvalidArgument as exc:  # a safety net: the loader refuses what canonical JSON cannot hold
            raise policy_error(source, None, "actions", f"cannot be hashed: {exc}") from None
    return Policy(
        schema=read.schema,
        actions=types.MappingProxyType(read.entries),
        hash=digest,
        source=source,
        text=text,
        environment=resolved,
        mode=read.mode,
        version=read.version,
        controls=types.MappingProxyType(read.controls),
        authority=read.authority,
        authority_document=authority,
    )


def load_policy(path: str | os.PathLike[str], *, environment: str | None = None,
                authority: str | os.PathLike[str] | AuthorityDocument | None = None) -> Policy:
    """Read and parse the policy file at ``path`` (and, when given, a standalone authority file to
    enforce with it); messages name the paths as given."""
    if authority is not None and not isinstance(authority, AuthorityDocument):
        authority = load_authority(authority)
    source, text = _read_text(path, "policy")
    return parse_policy(text, source, environment=environment, authority=authority)


#: The id a delegated grant is read under until it has its own (``dlg_...``): never stored.
_UNNAMED_GRANT = "delegated-grant"


def parse_grant(text: str, source: str = "<grant>", *, ident: str | None = None) -> Grant:
    """One grant document without ``id`` (what ``delegate --file`` reads, and a delegation's stored
    ``grant_json``), validated as a grant of the newest schema; ``ident`` becomes its id. A grant
    that names its own ``id`` is refused (InvalidArgument): a delegation's id is made by ctrlrun."""
    if not isinstance(text, str):
        raise InvalidArgument(f"a grant must be text (str), not {type(text).__name__}")
    reader = Reader(str(source))
    reader.schema, reader.version = NEWEST_SUPPORTED, SCHEMA_VERSION[NEWEST_SUPPORTED]
    with _collector_paused():
        document = load_yaml(text, str(source))
        if not isinstance(document, dict):
            reader.fail(getattr(document, "line", None), "top level",
                        f"a grant must be a mapping with 'subject' and 'actions', got {type_name(document)}")
        reader.check_values(document, "", document.line, set())
        if "id" in document:
            raise InvalidArgument(f"{source}: a delegated grant has no 'id' (line {document.key_lines['id']}): "
                                  f"ctrlrun names each delegation (dlg_...); remove it")
        document["id"] = _UNNAMED_GRANT
        grant = reader.read_grant(document, document.line, "grant", {})
    return dataclasses.replace(grant, id=ident if ident is not None else "")


def grant_json(grant: Grant) -> str:
    """A grant as a delegation row keeps it: its canonical form (budgets' windows in seconds,
    ``expires_at`` ISO with its offset) as sorted JSON, without its id."""
    return json.dumps(grant.canonical(), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def grant_from_json(text: str, ident: str) -> Grant:
    """A delegation row's ``grant_json`` read back (and validated again) as the grant ``ident``;
    ValueError (a sentence) when it is not a grant ctrlrun wrote."""
    try:
        data = json.loads(text)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"grant_json is not JSON ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("subject"), dict):
        raise ValueError("grant_json is not a grant (no 'subject' mapping)")
    document: dict[str, Any] = {}
    subject = {key: value for key, value in data["subject"].items() if value is not None}
    document["subject"] = subject
    for key in ("actions", "resources", "environments", "tasks", "expires_at"):
        if data.get(key) is not None:
            document[key] = data[key]
    if data.get("delegable"):
        document["delegable"] = True
    if data.get("constraints") is not None:
        if not isinstance(data["constraints"], dict):
            raise ValueError("grant_json constraints are not a mapping")
        document["constraints"] = {key: (value or {}).get("operand") if isinstance(value, dict) else value
                                   for key, value in data["constraints"].items()}
    if data.get("budgets") is not None:
        if not isinstance(data["budgets"], list):
            raise ValueError("grant_json budgets are not a list")
        document["budgets"] = [{**budget, "window": f"PT{budget.get('window')}S"} if isinstance(budget, dict)
                               else budget for budget in data["budgets"]]
    unknown = set(data) - {"actions", "budgets", "constraints", "delegable", "environments", "expires_at",
                           "resources", "subject", "tasks"}
    if unknown:
        raise ValueError(f"grant_json has keys a grant does not: {', '.join(sorted(unknown))}")
    try:
        return parse_grant(json.dumps(document), f"delegation {ident}", ident=ident)
    except (PolicyError, InvalidArgument) as exc:
        raise ValueError(" ".join(str(exc).split())) from None
