"""``verify``'s guarantees about the evidence's history, graded from the deployment itself: retention
(G28, G29, G30, G32) and the receipts imported from the reference (G31).

Like the rest of this port's ``verify``, nothing is re-run in a scratch store: each grade reads what
the deployment has — the anchor provider it is configured with (``CTRLRUN_ANCHOR_FILE``) and the
anchors it holds, the prune checkpoint the receipt chain starts from, the legal holds — and checks
them against the chain. A guarantee the deployment has not taken up (no provider, nothing pruned,
no hold) is ``not_applicable`` with the step that would make it apply.
"""
from __future__ import annotations

from typing import Any

#: The grades this module gives (verify.py hands them here).
IDS = ("G28", "G29", "G30", "G31", "G32")


def grade(gid: str, facts: Any, result: Any) -> Any:
    """The ``Result`` (the class verify.py passes as ``result``) for ``gid``, one of :data:`IDS`."""
    from . import anchor
    from .store.retention import checkpoint_ok, latest_checkpoint

    if gid == "G31":
        return _imported(facts, result)
    checkpoint = latest_checkpoint()
    if gid == "G30":
        return _holds(facts, checkpoint, result)
    if gid == "G29":
        if checkpoint is None:
            return result(gid, "not_applicable", "nothing has been pruned: the chain still starts at its genesis "
                          "('prune' writes the checkpoint this grades)")
        broken = facts.broken("receipt", "head", "checkpoint")
        if not checkpoint_ok(checkpoint):
            return result(gid, "fail", f"the prune checkpoint at seq {checkpoint.seq} does not carry ctrlrun's "
                          "signature: it was written or changed outside ctrlrun",
                          counterexample=[{"seq": checkpoint.seq, "hash": checkpoint.hash}])
        if broken:
            return result(gid, "fail", f"the chain from the prune checkpoint at seq {checkpoint.seq} names "
                          f"{len(broken)} break(s)", counterexample=broken[:10])
        return result(gid, "pass", f"the receipt chain verifies from the prune checkpoint at seq {checkpoint.seq} "
                      f"(pruned by {checkpoint.by}: {checkpoint.reason})")
    provider = anchor.load_provider(None)
    if provider is None:
        return result(gid, "not_applicable", "no anchor provider is configured (CTRLRUN_ANCHOR_FILE, a file on "
                      "another volume): without one, a store its owner truncated and re-signed cannot be told "
                      "from an honest one (docs/retention.md)")
    report = anchor.verify_anchors(provider)
    if report.unavailable:
        return result(gid, "fail", f"the anchor provider could not be read: {report.reason}")
    if gid == "G32" and checkpoint is None:
        return result(gid, "not_applicable", "nothing has been pruned, so no anchor has had to survive a prune")
    if report.checked == 0:
        if gid == "G32":
            return result(gid, "not_applicable", "no anchor is recorded, so a prune had none to keep")
        return result(gid, "fail", "an anchor provider is configured but holds no anchor: run 'anchor' (on a "
                      "schedule) so a rewound store is named")
    if report.breaks:
        what = "the store is behind or beside its anchors" if gid == "G28" else \
            "anchors taken before the prune no longer reproduce"
        return result(gid, "fail", f"{what}: {len(report.breaks)} of {report.checked} anchor(s) fail "
                      "'anchor --verify'", counterexample=report.breaks[:10])
    if gid == "G28":
        return result(gid, "pass", f"{report.checked} anchor(s) reproduce against the chain: a store rewound "
                      "behind the newest one is named by 'anchor --verify'")
    return result(gid, "pass", f"{report.checked} anchor(s) reproduce after the prune at seq {checkpoint.seq} "
                  f"({report.superseded} accounted for by its checkpoint)")


def _holds(facts: Any, checkpoint: Any, result: Any) -> Any:
    from .store.retention import hold_live, hold_ok, list_holds

    holds = list_holds()
    if not holds:
        return result("G30", "not_applicable", "no legal hold is placed ('hold place' puts one on a range)")
    edited = [{"hold_id": h.hold_id, "from_seq": h.from_seq, "to_seq": h.to_seq} for h in holds if not hold_ok(h)]
    if edited:
        return result("G30", "fail", f"{len(edited)} hold(s) were changed outside ctrlrun (their signature fails; a "
                      "prune still treats them as live)", counterexample=edited[:10])
    live = [h for h in holds if hold_live(h)]
    reached = [{"hold_id": h.hold_id, "from_seq": h.from_seq, "checkpoint": checkpoint.seq}
               for h in live if checkpoint is not None and h.from_seq <= checkpoint.seq]
    if reached:
        return result("G30", "fail", "a prune reached into a live hold's range", counterexample=reached[:10])
    if facts.guard is not None:
        return result("G30", "fail", "the database's guard is not current (X1): its triggers are what refuse a "
                      "held receipt's delete")
    names = ", ".join(h.hold_id for h in live[:5]) or "none live"
    return result("G30", "pass", f"{len(live)} live hold(s) ({names}): the guard refuses a prune into them, and "
                  "none reaches below the prune checkpoint")


def _imported(facts: Any, result: Any) -> Any:
    """Every receipt an import brought in still re-hashes under its own schema's keys and chains to the
    source head its STORE_IMPORTED names (and the event chain holding them verifies)."""
    from .canonical import GENESIS_HASH
    from .reference_store import SourceReceipt, check_chain
    from .store.imports import imported

    sources = imported()
    if not sources:
        return result("G31", "not_applicable", "this store's receipts are all its own: no reference store was "
                      "imported ('import' brings one in, its receipts v1-v7 verified)")
    broken = facts.broken("event", "head")
    if broken:
        return result("G31", "fail", f"the event chain holding the imported receipts names {len(broken)} break(s)",
                      counterexample=broken[:10])
    schemas: set[str] = set()
    count, failures = 0, []
    for source, documents in sources:
        receipts = [SourceReceipt(d.get("seq"), d.get("receipt_id", ""), d.get("schema", ""), d.get("hash"),
                                  d.get("prev_hash"), d.get("document", "")) for d in documents]
        schemas.update(r.schema for r in receipts)
        count += len(receipts)
        start = source.get("checkpoint") or {"seq": 0, "hash": GENESIS_HASH}
        verified, breaks = check_chain(receipts, source.get("head_seq", 0), source.get("head_hash", ""),
                                       (start.get("seq", 0), start.get("hash", "")))
        chained = sum(r.seq is not None for r in receipts)
        if verified != chained and not breaks:  # a document that no longer parses is skipped by the walk
            breaks = [{"name": "content_altered", "seq": None,
                       "detail": f"{chained - verified} imported receipt(s) no longer re-hash"}]
        failures += [{**b, "source": source.get("path")} for b in breaks]
    if failures:
        return result("G31", "fail", f"{len(failures)} break(s) in the imported receipts", counterexample=failures[:10])
    return result("G31", "pass", f"{count} receipt(s) imported from {len(sources)} reference store(s), of "
                  f"{len(schemas)} schema(s) ({', '.join(sorted(s.rsplit('/', 1)[-1] for s in schemas))}), re-hash "
                  "under their own keys and chain to the head each import recorded")
