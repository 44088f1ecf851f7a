"""``anchor`` (§F1): the chain head recorded outside the store, and the store checked against it.

An ``AnchorProvider`` is the operator's: ``make(seq, hash, kind) -> (token, at)``, ``check(seq, hash,
token) -> bool``, ``latest() -> (seq, token) | None``, ``since(seq) -> [Anchor]``. ctrlrun ships one,
:class:`FileProvider` (``CTRLRUN_ANCHOR_FILE``: a file on another volume, one JSON line per anchor,
each hash-chained to the line before and signed); docs/retention.md says how to write one for an
object store with retention locks. The bytes vouched for are ``canonical_bytes({"domain":
"ctrlrun.anchor/v1", "seq", "hash", "kind"})``.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import importlib
import json
import os
from pathlib import Path
from typing import Any, Protocol

from . import signing
from .canonical import canonical_bytes, evidence_time
from .errors import InvalidArgument

DOMAIN = "ctrlrun.anchor/v1"
KINDS = ("interval", "checkpoint")


@dataclasses.dataclass(frozen=True)
class Anchor:
    seq: int
    hash: str
    token: str
    kind: str
    at: str

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class AnchorProvider(Protocol):
    def make(self, seq: int, hash: str, kind: str) -> tuple[str, str]: ...
    def check(self, seq: int, hash: str, token: str) -> bool: ...
    def latest(self) -> tuple[int, str] | None: ...
    def since(self, seq: int) -> list[Anchor]: ...


class AnchorUnavailable(Exception):
    """The provider cannot be reached: not a break (``unavailable``)."""


def vouched(seq: int, hash_: str, kind: str) -> bytes:
    return canonical_bytes({"domain": DOMAIN, "seq": seq, "hash": hash_, "kind": kind})


class FileProvider:
    """Append-only JSON lines; each line's ``prev`` is the sha256 of the line before and its ``mac`` signs
    the line, so an edited, removed or reordered line is named by ``check``."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)

    def _lines(self) -> list[dict[str, Any]]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise AnchorUnavailable(f"the anchor file {self.path} cannot be read: {exc}") from exc
        out, prev = [], "0" * 64
        for number, line in enumerate(text.splitlines(), 1):
            try:
                entry = json.loads(line)
                fields = [entry["seq"], entry["hash"], entry["kind"], entry["at"], entry["prev"]]
            except (ValueError, KeyError, TypeError):
                entry, fields = {"seq": -1, "hash": "", "kind": "", "at": "", "prev": ""}, None
            entry["_ok"] = (fields is not None and entry["prev"] == prev
                            and signing.is_valid(DOMAIN, fields, entry.get("mac")))
            entry["_line"] = number
            out.append(entry)
            prev = hashlib.sha256(line.encode("utf-8")).hexdigest()
        return out

    def make(self, seq: int, hash: str, kind: str) -> tuple[str, str]:
        lines = self.path.read_text(encoding="utf-8").splitlines() if self.path.exists() else []
        prev = hashlib.sha256(lines[-1].encode("utf-8")).hexdigest() if lines else "0" * 64
        at = evidence_time(dt.datetime.now(dt.timezone.utc))
        entry = {"seq": seq, "hash": hash, "kind": kind, "at": at, "prev": prev,
                 "vouched": hashlib.sha256(vouched(seq, hash, kind)).hexdigest()}
        entry["mac"] = signing.sign(DOMAIN, [seq, hash, kind, at, prev])
        line = json.dumps(entry, sort_keys=True)
        with open(self.path, "a", encoding="utf-8") as out:  # append only: never rewritten
            out.write(line + "\n")
            out.flush()
            os.fsync(out.fileno())
        return f"{self.path.name}:{len(lines) + 1}", at

    def check(self, seq: int, hash: str, token: str) -> bool:
        number = int(token.rsplit(":", 1)[1])
        lines = self._lines()
        if number > len(lines):
            return False
        entry = lines[number - 1]
        return bool(entry["_ok"]) and entry["seq"] == seq and entry["hash"] == hash

    def latest(self) -> tuple[int, str] | None:
        lines = self._lines()
        return (lines[-1]["seq"], f"{self.path.name}:{len(lines)}") if lines else None

    def since(self, seq: int) -> list[Anchor]:
        return [Anchor(e["seq"], e["hash"], f"{self.path.name}:{e['_line']}", e["kind"], e["at"])
                for e in self._lines() if e["seq"] >= seq or not e["_ok"]]


def load_provider(spec: str | None) -> Any:
    """``MODULE:ATTR`` (an instance, or a class/factory called with no arguments); None: the file
    provider at ``CTRLRUN_ANCHOR_FILE`` if that is set, else no provider."""
    if spec is None:
        from django.conf import settings

        path = os.environ.get("CTRLRUN_ANCHOR_FILE") or getattr(settings, "CTRLRUN_ANCHOR_FILE", None)
        return FileProvider(path) if path else None
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise InvalidArgument(f"--provider takes MODULE:ATTR (e.g. myproject.anchors:provider), not {spec!r}")
    try:
        found = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise InvalidArgument(f"--provider {spec}: {exc}") from None
    return found() if isinstance(found, type) or (callable(found) and not hasattr(found, "make")) else found


def make_anchor(provider: Any, *, seq: int | None = None, hash_: str | None = None,
                kind: str = "interval") -> Anchor:
    """Anchor (seq, hash): the head's by default."""
    if kind not in KINDS:
        raise InvalidArgument(f"--kind is interval or checkpoint, not {kind!r}")
    if seq is None:
        from .store.evidence import head_hash

        seq, hash_ = head_hash()
    token, at = provider.make(seq, hash_, kind)
    return Anchor(seq, hash_, token, kind, at)


@dataclasses.dataclass
class AnchorReport:
    ok: bool = True
    unavailable: bool = False
    reason: str | None = None
    checked: int = 0
    superseded: int = 0
    breaks: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def verify_anchors(provider: Any) -> AnchorReport:
    """Every anchor the provider holds against this chain: each must reproduce (the receipt at its seq
    holds its hash), or be accounted for by an anchored checkpoint at or above it (superseded)."""
    from .store.evidence import head_hash
    from .store.retention import latest_checkpoint, receipt_hash_at

    report = AnchorReport()
    try:
        anchors = provider.since(0)
    except AnchorUnavailable as exc:
        return AnchorReport(ok=True, unavailable=True, reason=str(exc))
    checkpoint = latest_checkpoint()
    head_seq, _ = head_hash()
    for anchor in anchors:
        report.checked += 1

        def broken(name: str, detail: str) -> None:
            report.breaks.append({"name": name, "seq": anchor.seq, "detail": detail})

        if not provider.check(anchor.seq, anchor.hash, anchor.token):
            broken("anchor_repudiated", f"the provider does not vouch for anchor {anchor.token} (edited, or not "
                   "its own)")
            continue
        if checkpoint is not None and anchor.seq <= checkpoint.seq:
            if anchor.seq == checkpoint.seq and anchor.hash != checkpoint.hash:
                broken("anchor_broken", f"the checkpoint at seq {anchor.seq} holds {checkpoint.hash}, the anchor "
                       f"{anchor.hash}")
            else:
                report.superseded += 1
            continue
        if anchor.seq > head_seq:
            broken("anchor_broken", f"receipt {anchor.seq} is absent: the head is at seq {head_seq}, behind this "
                   "anchor, and no checkpoint accounts for it (the store was rewound)")
            continue
        found = receipt_hash_at(anchor.seq)
        if found != anchor.hash:
            broken("anchor_broken" if found else "anchor_missing",
                   f"receipt {anchor.seq} " + (f"holds {found}, the anchor {anchor.hash}" if found else "is gone"))
    report.ok = not report.breaks
    return report
