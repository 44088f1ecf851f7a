"""``verify`` (spec §F7): grade this deployment's own configuration and store against the guarantees.

The reference derives scenarios from the policy and runs them in a scratch store. This port grades
the deployment itself: the configured policy and authority (which guarantees apply to it), the
configured store (every chain and signed row verified in full, read-only), the guard the database
has installed, where the signing key comes from, what the connected database role may do, and the
last recorded chain check. Each guarantee of ``ctrlrun.guarantees/v7`` (G1-G32) is ``pass``,
``fail`` (with the evidence that fails it as its counterexample), ``not_applicable`` (with the
reason) or ``skipped`` (not selected); X1-X4 are the port's own promises, beyond the catalogue.
docs/verify.md says what each check reads; the behaviour behind each guarantee is pinned by the test
suite, not re-run here (a deployment's store is never a scratch store).
"""
from __future__ import annotations

import datetime as dt
import hashlib
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import __version__

SCHEMA = "ctrlrun.verify/v1"
CATALOGUE = "ctrlrun.guarantees/v7"

#: The reference's catalogue, titles verbatim (they are the report's identifiers).
TITLES: dict[str, str] = {
    "G1": "mutated approval refused", "G2": "replayed approval refused", "G3": "duplicate effect refused",
    "G4": "one winner under concurrency", "G5": "ambiguous blocks a blind retry", "G6": "unknown action refused",
    "G7": "no principal refused", "G8": "expired authority refused", "G9": "delegation cannot escalate",
    "G10": "unknown exception is ambiguous", "G11": "an altered receipt is detected",
    "G12": "a byte written is ambiguous", "G13": "clock divergence is named", "G14": "token changes across a renewal",
    "G15": "renewal past the ceiling refused", "G16": "a moved fingerprint is refused",
    "G17": "an unentitled approver refused", "G18": "the requester cannot approve", "G19": "one principal counts once",
    "G20": "revoked before its exp: no", "G21": "unapproved policy decides no",
    "G22": "held budget refuses next reserve", "G23": "a failing scope provider refuses",
    "G24": "grant refused off its task", "G25": "a hop narrows or it is refused", "G26": "a hop is named on both sides",
    "G27": "a swapped upstream is denied", "G28": "truncation past an anchor fails",
    "G29": "a prune adds no new chain break", "G30": "a held range refuses to prune",
    "G31": "five receipt schemas verify", "G32": "an honest prune keeps anchors",
    # The port's own promises, beyond the reference's catalogue.
    "X1": "the guard is installed and current", "X2": "the signing key is outside the database",
    "X3": "the application role cannot alter triggers", "X4": "the last chain check is recent and intact",
}
IDS = tuple(TITLES)

PASS, FAIL, NOT_APPLICABLE, SKIPPED = "pass", "fail", "not_applicable", "skipped"


class Refused(Exception):
    """The configuration was refused or is unusable (exit 2): observe mode, an unknown ``--only`` id."""


@dataclass
class Result:
    id: str
    status: str
    reason: str
    action: str | None = None
    detail: str | None = None
    counterexample: list[dict[str, Any]] | None = None
    grant_id: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "title": TITLES[self.id], "status": self.status, "reason": self.reason,
                "action": self.action, "arguments": None, "effect_key": None, "grant_id": self.grant_id,
                "descends_from": None, "detail": self.detail, "counterexample": self.counterexample}


@dataclass
class Facts:
    """What the checks read, each once."""

    policy: Any
    vendor: str
    breaks: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # by kind
    guard: tuple[int | None, list[str]] | None = None
    guard_error: str | None = None

    def broken(self, *kinds: str) -> list[dict[str, Any]]:
        return [b for kind in kinds for b in self.breaks.get(kind, [])]


def parse_only(text: str | None) -> tuple[str, ...]:
    """``--only G1,G3`` as ids, in catalogue order; an unknown id is refused naming the registry."""
    if not text:
        return ()
    asked = [part.strip().upper() for part in text.split(",") if part.strip()]
    unknown = [part for part in asked if part not in TITLES]
    if unknown or not asked:
        raise Refused(f"--only {text!r}: no guarantee {', '.join(unknown) or '(none named)'}; the registry is "
                      f"{CATALOGUE}: {', '.join(IDS)}")
    return tuple(i for i in IDS if i in asked)


def _sha256(path: Path | None) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest() if path else None
    except OSError:
        return None


def _actions(policy: Any, test: Any) -> list[str]:
    return sorted(name for name, entry in policy.actions.items() if test(entry))


def _approves(entry: Any) -> bool:
    from .states import Decision

    return entry.decision is Decision.APPROVE or any(rule.decision is Decision.APPROVE for rule in entry.rules)


def _grants(policy: Any) -> list[Any]:
    return list(policy.authority.grants.values()) if policy.authority is not None else []


def _evidence(facts: Facts, gid: str, kinds: tuple[str, ...], applies: str, holds: str) -> Result:
    broken = facts.broken(*kinds)
    if broken:
        return Result(gid, FAIL, f"{applies}, but the store holds {', '.join(kinds)} rows ctrlrun did not write or "
                      f"that were changed ({len(broken)} named): {holds} rests on those rows",
                      counterexample=broken[:10])
    if facts.guard is not None:
        return Result(gid, FAIL, f"{applies}, but the database's guard is not current (X1): {holds} rests on its "
                      "triggers")
    return Result(gid, PASS, f"{applies}; the {', '.join(kinds)} rows verify and the guard is current: {holds}")


def _grade(gid: str, facts: Facts) -> Result:
    from . import conf

    policy = facts.policy
    keyed = _actions(policy, lambda e: e.effect is not None)
    approving = _actions(policy, _approves)
    grants = _grants(policy)
    first = lambda names: names[0] if names else None  # noqa: E731
    no_keys = "no action of the policy declares an effect key"
    no_approve = "no action of the policy can decide approve"
    not_built = "not built in this port (docs/reference-differences.md)"
    if gid in ("G1", "G2", "G18"):
        if not approving:
            return Result(gid, NOT_APPLICABLE, no_approve)
        held = {"G1": "an approval is bound to the action hash it was asked for",
                "G2": "an approval is consumed once", "G18": "the requester's own answer is refused"}[gid]
        result = _evidence(facts, gid, ("approval",), f"{len(approving)} action(s) can decide approve", held)
        result.action = first(approving)
        return result
    if gid == "G14":
        return Result(gid, NOT_APPLICABLE, "this port's lease has no holder token to change: a renewal is conditional "
                      "on the holder (action id, attempt) and the signed record (docs/reference-differences.md)")
    if gid in ("G3", "G4", "G5", "G10", "G12"):
        if not keyed:
            return Result(gid, NOT_APPLICABLE, no_keys)
        held = {"G3": "one effect key, one effect record (its primary key)",
                "G4": "the record's row lock picks one winner (pinned across OS processes by the test suite)",
                "G5": "an AMBIGUOUS record refuses a retry until resolved",
                "G10": "an exception the transport cannot classify leaves the record AMBIGUOUS",
                "G12": "a call that may have sent bytes is AMBIGUOUS, never failed"}[gid]
        result = _evidence(facts, gid, ("effect", "head"), f"{len(keyed)} action(s) declare an effect key", held)
        result.action = first(keyed)
        return result
    if gid == "G6":
        name = "ctrlrun.verify.no-such-action"
        while name in policy.actions:
            name += "-"
        evaluation = policy.evaluate(name, {})
        if evaluation.decision.value == "deny":
            return Result(gid, PASS, f"the policy decides an action it does not name ({name!r}): deny, "
                          f"{evaluation.reason}", action=name)
        return Result(gid, FAIL, f"the policy decides an unknown action {evaluation.decision.value}", action=name,
                      counterexample=[{"action": name, "decision": evaluation.decision.value}])
    if gid == "G7":
        provider = conf.identity_provider()
        how = (f"the identity provider {type(provider).__name__}" if provider is not None
               else "ctrlrun.context(agent=...)")
        return Result(gid, PASS, "every action is refused no_principal without a principal; nothing in the "
                      f"configuration turns that off (principals come from {how})")
    if gid == "G8":
        expiring = [g.id for g in grants if g.expires_at is not None]
        if not expiring:
            return Result(gid, NOT_APPLICABLE, "no grant of the authority has expires_at")
        result = _evidence(facts, gid, ("delegation",), f"{len(expiring)} grant(s) expire",
                           "a grant past expires_at (by the store's clock) is refused authority_expired")
        result.grant_id = expiring[0]
        return result
    if gid in ("G9", "G24"):
        chosen = [g.id for g in grants if (g.delegable if gid == "G9" else g.tasks)]
        if not chosen:
            return Result(gid, NOT_APPLICABLE, "no grant of the authority is delegable" if gid == "G9"
                          else "no grant of the authority names tasks")
        held = ("a delegation wider than its parent is refused (containment)" if gid == "G9"
                else "a call off the grant's tasks is refused authority_task")
        result = _evidence(facts, gid, ("delegation",), f"{len(chosen)} grant(s) apply", held)
        result.grant_id = chosen[0]
        return result
    if gid == "G11":
        broken = facts.broken("receipt", "event", "head", "check")
        if broken:
            return Result(gid, FAIL, f"the full chain check names {len(broken)} break(s) in the receipts and events",
                          counterexample=broken[:10])
        return Result(gid, PASS, "the receipts and events verify from the genesis, under this store's signing key")
    if gid == "G13":
        return _clock(facts)
    if gid in ("G28", "G29", "G30", "G31", "G32"):
        from . import verify_evidence

        return verify_evidence.grade(gid, facts, Result)
    if gid in ("G15", "G23", "G25", "G26"):
        return Result(gid, NOT_APPLICABLE, not_built)
    if gid == "G16":
        return Result(gid, NOT_APPLICABLE, "preconditions are declared in code (protect(precondition=...)), not in "
                      "the policy: this report cannot see them (tests/ pins the refusal)")
    if gid in ("G17", "G19"):
        if gid == "G17":
            named = [c.id for c in policy.controls.values() if getattr(c, "approver_role", None)]
            key, held = "approver_role", "an approver without the control's role is refused approver_unentitled"
        else:
            named = _actions(policy, lambda e: getattr(e, "approvals_required", 1) > 1)
            key, held = "approvals_required above 1", "one principal's answers count once toward M of N"
        if not named:
            return Result(gid, NOT_APPLICABLE, f"the policy declares no {key}")
        return _evidence(facts, gid, ("approval",), f"{len(named)} declare {key}", held)
    if gid == "G20":
        provider = conf.identity_provider()
        if getattr(provider, "revocations", None) is None:
            return Result(gid, NOT_APPLICABLE, "no identity provider with a revocation feed is configured")
        return Result(gid, PASS, f"{type(provider).__name__} consults its revocation feed before a token's exp")
    if gid == "G21":
        if not conf.require_approved_policy():
            return Result(gid, NOT_APPLICABLE, "settings.CTRLRUN_REQUIRE_APPROVED_POLICY is off")
        return _evidence(facts, gid, ("policy",), "an approved policy is required",
                         "a policy text no approval names decides no")
    if gid == "G22":
        budgeted = [g.id for g in grants if g.budgets]
        if not budgeted:
            return Result(gid, NOT_APPLICABLE, "no grant of the authority has budgets")
        result = _evidence(facts, gid, ("ledger",), f"{len(budgeted)} grant(s) have budgets",
                           "a held charge counts against the next reservation")
        result.grant_id = budgeted[0]
        return result
    if gid == "G27":
        pinned = _actions(policy, lambda e: getattr(e, "upstream", None))
        if not pinned:
            return Result(gid, NOT_APPLICABLE, "the policy declares no upstream pins (v8 'upstream:')")
        return Result(gid, PASS, f"{len(pinned)} action(s) pin their upstream ({', '.join(pinned[:5])}): the gateway "
                      "reads the tool and its certificate again at each call and refuses a changed one -41016 "
                      "(upstream_mismatch); called in-process, a pinned action is refused upstream_unverified",
                      action=pinned[0])
    return _own(gid, facts)


def _clock(facts: Facts) -> Result:
    if facts.vendor != "postgresql":
        return Result("G13", NOT_APPLICABLE, "the store is SQLite: its clock is this host's clock, nothing to compare")
    from django.db import connections

    from .store import alias
    from .store.clock import measure

    skew = measure(connections[alias()])
    data = skew.event_data()
    text = (f"this host's clock is {data['direction']} the database's by {abs(skew.skew.total_seconds()):.3f} s "
            f"(± {skew.bound.total_seconds():.3f} s; threshold {skew.threshold.total_seconds():g} s)")
    if skew.exceeded:
        return Result("G13", FAIL, text + ": CLOCK_SKEW_DETECTED is recorded by this host's calls",
                      counterexample=[data])
    return Result("G13", PASS, text + "; a host beyond the threshold records CLOCK_SKEW_DETECTED", detail=str(data))


def _own(gid: str, facts: Facts) -> Result:
    from . import conf, guards, signing
    from . import store

    if gid == "X1":
        if facts.guard_error:
            return Result(gid, FAIL, facts.guard_error)
        if facts.guard is None:
            return Result(gid, PASS, f"the database records guard version {guards.CURRENT} with every trigger")
        version, missing = facts.guard
        if version is None:
            why = "the database records no ctrlrun guard"
        elif version > guards.CURRENT:
            why = f"the database's guard is version {version}, newer than this code ({guards.CURRENT})"
        elif missing:
            why = f"guard version {version} lacks {len(missing)} trigger(s): {', '.join(missing[:5])}"
        else:
            why = f"the database's guard is version {version}, older than {guards.CURRENT}"
        return Result(gid, FAIL, why + " (manage.py migrate ctrlrun puts the current one back)",
                      counterexample=[{"version": version, "missing": missing}])
    if gid == "X2":
        source = signing.key_source()
        detail = None
        if "file" in source and facts.vendor == "sqlite":
            detail = "a key file beside a SQLite store protects against whoever lacks the file, not its folder's owner"
        return Result(gid, PASS, f"the key is {source}; the database holds only its id", detail=detail)
    if gid == "X3":
        return _role(facts)
    check = store.last_check()
    limit = conf.chain_check_max_age()
    if check is None:
        return Result(gid, FAIL, "no chain check is recorded: run 'receipts --verify-chain' on a schedule")
    age = store.now() - check.checked_at
    if not check.ok:
        return Result(gid, FAIL, f"the last recorded chain check (#{check.id}) found {check.breaks} break(s)",
                      counterexample=[{"check": check.id, "breaks": check.breaks}])
    if age > limit:
        return Result(gid, FAIL, f"the last chain check (#{check.id}) is {int(age.total_seconds())} s old, beyond "
                      f"CTRLRUN_CHAIN_CHECK_MAX_AGE_SECONDS ({int(limit.total_seconds())})")
    return Result(gid, PASS, f"the last chain check (#{check.id}, {check.mode}) found the chain intact "
                  f"{int(age.total_seconds())} s ago (limit {int(limit.total_seconds())} s)")


def _role(facts: Facts) -> Result:
    if facts.vendor != "postgresql":
        return Result("X3", NOT_APPLICABLE, "the store is SQLite: it has no roles, whoever can write the file can "
                      "drop its triggers; the signing key outside the file is what names such edits (X2)")
    from django.db import connections

    from .store import alias

    with connections[alias()].cursor() as cursor:
        cursor.execute("SELECT current_user, rolsuper FROM pg_roles WHERE rolname = current_user")
        user, superuser = cursor.fetchone()
        cursor.execute("SELECT DISTINCT tableowner FROM pg_tables WHERE tablename LIKE 'ctrlrun\\_%%' "
                       "AND pg_has_role(current_user, tableowner, 'USAGE')")
        owned = sorted(owner for (owner,) in cursor.fetchall())
    if superuser:
        return Result("X3", FAIL, f"the store connects as {user!r}, a superuser: it can drop the guard's triggers",
                      counterexample=[{"role": user, "superuser": True}])
    if owned:
        return Result("X3", FAIL, f"the store connects as {user!r}, which owns (or acts as) the owner of ctrlrun's "
                      f"tables ({', '.join(owned)}): it can drop or disable their triggers",
                      counterexample=[{"role": user, "owners": owned}])
    return Result("X3", PASS, f"the store connects as {user!r}: not a superuser, owning no ctrlrun table")


def _facts(policy: Any) -> Facts:
    from django.db import connections

    from . import guards, store

    connection = connections[store.alias()]
    facts = Facts(policy, connection.vendor)
    report = store.verify()
    for item in report.breaks:
        facts.breaks.setdefault(item.kind, []).append(item.as_dict())
    try:
        facts.guard = guards.problem(connection)
    except Exception as exc:  # noqa: BLE001 - the database's catalog unreadable is the finding
        facts.guard_error = f"the guard's version could not be read: {type(exc).__name__}: {exc}"
    return facts


def run(only: tuple[str, ...] = ()) -> dict[str, Any]:
    """Grade the configured deployment: the ``ctrlrun.verify/v1`` document. Raises :class:`Refused`
    for a configuration that cannot be graded (observe mode)."""
    from . import conf, store
    from .control import default_control

    started = store.now()
    policy = default_control().read_policy()
    if policy.observing:
        raise Refused("the policy is in observe mode (mode: observe): nothing is enforced, so no guarantee "
                      "holds; set mode: enforce to grade it")
    facts = _facts(policy)
    results = [_grade(gid, facts) if not only or gid in only else Result(gid, SKIPPED, "not selected")
               for gid in IDS]
    authority_path = conf.authority_path()
    grants = _grants(policy)
    counted = [r for r in results if r.status != SKIPPED]
    summary = {"passed": sum(r.status == PASS for r in results), "failed": sum(r.status == FAIL for r in results),
               "applicable": sum(r.status in (PASS, FAIL) for r in results),
               "not_applicable": sum(r.status == NOT_APPLICABLE for r in results),
               "skipped": sum(r.status == SKIPPED for r in results)}
    summary["badge"] = f"{summary['passed']}/{summary['applicable']}"
    return {
        "schema": SCHEMA, "catalogue": CATALOGUE, "ctrlrun_version": __version__,
        "started_at": _iso(started), "finished_at": _iso(store.now()),
        "policy": {"path": policy.source, "sha256": hashlib.sha256(policy.text.encode("utf-8")).hexdigest(),
                   "schema": policy.schema, "mode": policy.mode, "actions": sorted(policy.actions)},
        "authority": None if policy.authority is None else {
            "path": str(authority_path) if authority_path else policy.source,
            "sha256": _sha256(authority_path) if authority_path else None, "grants": sorted(g.id for g in grants),
            "max_delegation_depth": policy.authority.max_delegation_depth},
        "store": {"backend": facts.vendor, "scratch": False},
        "partial": bool(only) and len(counted) < len(results),
        "summary": summary,
        "guarantees": [r.as_dict() for r in results],
    }


def _iso(moment: dt.datetime) -> str:
    from .receipts import event_time

    return event_time(moment)


def exit_status(document: dict[str, Any]) -> int:
    """0: every applicable check passes and at least one applies; 1: one failed; 2: nothing applies."""
    summary = document["summary"]
    if summary["failed"]:
        return 1
    return 0 if summary["applicable"] else 2


def lines(document: dict[str, Any]) -> list[str]:
    """The text report."""
    policy, authority, summary = document["policy"], document["authority"], document["summary"]
    out = [f"CTRLRun verify — ctrlrun {document['ctrlrun_version']}, catalogue {document['catalogue']}",
           f"policy {policy['path']} ({policy['schema']}, mode: {policy['mode']})",
           "authority " + (f"{authority['path']} ({len(authority['grants'])} grants)" if authority else "none"),
           f"store {document['store']['backend']}, the deployment's own (not a scratch store)", ""]
    width = max(len(TITLES[i]) for i in IDS)
    labels = {PASS: "PASS", FAIL: "FAIL", NOT_APPLICABLE: "N/A", SKIPPED: "SKIP"}
    for item in document["guarantees"]:
        subject = item["action"] or item["grant_id"] or ""
        row = f"{item['id']:<4} {item['title']:<{width}}  {labels[item['status']]:<4}  {subject}".rstrip()
        out.append(row)
        if item["status"] in (FAIL, NOT_APPLICABLE, SKIPPED):
            out.append(f"       {item['reason']}")
    out.append("")
    text = f"{summary['passed']}/{summary['applicable']} declared guarantees pass."
    if summary["failed"]:
        text += f" {summary['failed']} FAILED."
    if summary["not_applicable"]:
        missing = [i["id"] for i in document["guarantees"] if i["status"] == NOT_APPLICABLE]
        text += f" {summary['not_applicable']} not applicable: {', '.join(missing)}."
    out.append(text)
    return out


def junit(document: dict[str, Any]) -> bytes:
    """The report as a JUnit XML file: one testcase a check, ``failure`` for fail, ``skipped`` otherwise."""
    summary = document["summary"]
    suite = ET.Element("testsuite", name="ctrlrun.verify", tests=str(len(document["guarantees"])),
                       failures=str(summary["failed"]), errors="0",
                       skipped=str(summary["not_applicable"] + summary["skipped"]), timestamp=document["started_at"])
    properties = ET.SubElement(suite, "properties")
    for name, value in (("catalogue", document["catalogue"]), ("ctrlrun_version", document["ctrlrun_version"]),
                        ("policy", document["policy"]["path"]), ("policy_sha256", document["policy"]["sha256"]),
                        ("applicable", summary["applicable"]), ("not_applicable", summary["not_applicable"])):
        ET.SubElement(properties, "property", name=name, value=str(value))
    for item in document["guarantees"]:
        case = ET.SubElement(suite, "testcase", classname="ctrlrun.verify", name=f"{item['id']} {item['title']}")
        if item["status"] == FAIL:
            ET.SubElement(case, "failure", message=item["reason"]).text = repr(item["counterexample"])
        elif item["status"] != PASS:
            ET.SubElement(case, "skipped", message=item["reason"])
    return ET.tostring(suite, encoding="utf-8", xml_declaration=True)
