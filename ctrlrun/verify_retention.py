"""``verify``'s retention guarantees (G28, G29, G30, G32), graded from the deployment itself.

Like the rest of this port's ``verify``, nothing is re-run in a scratch store: each grade reads what
the deployment has — the anchor provider it is configured with (``CTRLRUN_ANCHOR_FILE``) and the
anchors it holds, the prune checkpoint the receipt chain starts from, the legal holds — and checks
them against the chain. A guarantee the deployment has not taken up (no provider, nothing pruned,
no hold) is ``not_applicable`` with the step that would make it apply.
"""
from __future__ import annotations

from typing import Any

#: The grades this module gives (verify.py hands them here).
IDS = ("G28", "G29", "G30", "G32")


def grade(gid: str, facts: Any, result: Any) -> Any:
    """The ``Result`` (the class verify.py passes as ``result``) for ``gid``, one of :data:`IDS`."""
    from . import anchor
    from .store.retention import checkpoint_ok, latest_checkpoint

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
