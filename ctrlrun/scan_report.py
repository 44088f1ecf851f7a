"""What ``scan`` prints (text and ``ctrlrun.scan/v1``), and ``scan --coverage`` (spec §F6): the policy's
actions and the protected names no receipt names. Pure: the receipts are given as documents."""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from .display import reveal
from .scan import KINDS, SCHEMA, ScanResult, root_grant_holders

__all__ = ["COVERAGE_SCHEMA", "FOOTER", "coverage", "scan_document", "scan_text", "coverage_text"]

COVERAGE_SCHEMA = "ctrlrun.coverage/v1"
FOOTER = ("scan is a finder, not a proof: it reads names, not behaviour. A call it cannot name, a consequence "
          "behind an innocent name, or code it cannot see (a dependency, a string run later) is not covered.")


def coverage(policy: Any, protected: Sequence[tuple[str, int, str]], documents: Iterable[dict[str, Any] | None],
             *, policy_file: str | None) -> dict[str, Any]:
    """``ctrlrun.coverage/v1``: which policy actions (``policy_action``) and protected names
    (``protected_action``) no receipt names. No score: a list of what was never seen."""
    seen: set[str] = set()
    read = 0
    for document in documents:
        read += 1
        if document is not None and isinstance(document.get("action"), str):
            seen.add(document["action"])
    unused: list[dict[str, str]] = []
    listed: set[tuple[str, str]] = set()
    if policy is not None:
        for name in policy.actions:
            if name not in seen:
                unused.append({"kind": "policy_action", "name": name,
                               "reason": f"the policy lists {name!r} and none of the {read} receipts names it"})
                listed.add(("policy_action", name))
    for file, line, name in sorted(protected, key=lambda p: (p[2], p[0], p[1])):
        if name in seen or ("protected_action", name) in listed or ("policy_action", name) in listed:
            continue
        listed.add(("protected_action", name))
        unused.append({"kind": "protected_action", "name": name,
                       "reason": f"protected at {file}:{line} and none of the {read} receipts names it"})
    return {"schema": COVERAGE_SCHEMA, "policy": policy_file, "receipts_read": read, "actions_seen": len(seen),
            "unused": unused}


def scan_document(result: ScanResult, *, vocabulary: Sequence[str], vocabulary_source: str, policy: Any,
                  policy_file: str | None, coverage_document: dict[str, Any] | None = None) -> dict[str, Any]:
    document: dict[str, Any] = {
        "schema": SCHEMA,
        "root": result.root,
        "findings": [f.as_dict() for f in result.findings],
        "suppressed": [s.as_dict() for s in result.suppressed],
        "undetermined": [u.as_dict() for u in result.undetermined],
        "root_grant_holders": root_grant_holders(policy) if policy is not None else [],
        "totals": {"files_read": result.files_read, "files_excluded": result.files_excluded,
                   "findings": len(result.findings), "suppressed": len(result.suppressed),
                   "undetermined": len(result.undetermined)},
        "vocabulary": list(vocabulary),
        "vocabulary_source": vocabulary_source,
        "policy": policy_file,
    }
    if coverage_document is not None:
        document["coverage"] = coverage_document
    return document


def _where(file: str, line: int | None) -> str:
    return reveal(file) if line is None else f"{reveal(file)}:{line}"


def scan_text(document: dict[str, Any]) -> list[str]:
    lines = [f"ctrlrun scan — {reveal(document['root'])}"]
    for kind in KINDS:
        found = [f for f in document["findings"] if f["kind"] == kind]
        if not found:
            continue
        lines.append(f"{kind} ({len(found)})")
        for f in found:
            shown = f["target"] or f["name"] or f["detail"]
            lines.append(f"  {_where(f['file'], f['line'])}  {reveal(shown)}  [{kind}: {f['rule']}]")
            if f["target"] is not None or f["name"] is not None:
                lines.append(f"      {reveal(f['detail'])}")
    if document["undetermined"]:
        lines.append(f"undetermined ({len(document['undetermined'])})")
        lines += [f"  {_where(u['file'], u['line'])}  {reveal(u['expression'])}" for u in document["undetermined"]]
    if document["suppressed"]:
        lines.append(f"suppressed ({len(document['suppressed'])})")
        lines += [f"  {_where(s['file'], s['line'])}  {reveal(s['target'])}  [{s['rule']}]  — {reveal(s['reason'])}"
                  for s in document["suppressed"]]
    holders = document["root_grant_holders"]
    if holders:
        lines.append(f"holds a root grant ({len(holders)})")
        for h in holders:
            subject = ", ".join(f"{k} {reveal(str(h[k]))}" for k in ("agent", "user") if h[k] is not None)
            lines.append(f"  {subject}  (grant {reveal(h['grant_id'])}: {reveal(', '.join(h['actions']))})")
    totals = document["totals"]
    lines.append(f"files read {totals['files_read']} / excluded {totals['files_excluded']} / findings "
                 f"{totals['findings']} / suppressed {totals['suppressed']} / undetermined {totals['undetermined']}")
    lines.append(f"vocabulary: {len(document['vocabulary'])} verbs ({reveal(document['vocabulary_source'])})")
    lines.append(f"policy: {reveal(document['policy']) if document['policy'] else 'none'}")
    if "coverage" in document:
        lines += coverage_text(document["coverage"])
    lines.append(FOOTER)
    return lines


def coverage_text(document: dict[str, Any]) -> list[str]:
    lines = [f"coverage: {document['receipts_read']} receipts read, {document['actions_seen']} actions seen"]
    if not document["unused"]:
        lines.append("  every listed action appears in the receipts")
        return lines
    lines.append(f"never exercised ({len(document['unused'])})")
    lines += [f"  {u['kind']}  {reveal(u['name'])}  — {reveal(u['reason'])}" for u in document["unused"]]
    return lines
