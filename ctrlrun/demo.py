"""The guided demo: what ctrlrun does, told through scenarios against stand-in remotes.

``python manage.py demo`` (or ``ctrlrun demo``) runs ``python -m ctrlrun.demo FOLDER`` as a
separate process, so the demo always uses its own scratch SQLite store (FOLDER/.ctrlrun/
state.db beside FOLDER/ctrlrun.yaml), whatever database the surrounding project uses. The race
scenario starts more processes of its own: the guarantee it shows is across processes.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

POLICY = """\
schema: ctrlrun.policy/v2

actions:
  stripe.refund:
    effect: "refund:{payment_id}"
    rules:
      - when: { amount_gte: 0, amount_lte: 50000 }
        decision: allow
      - when: { amount_gte: 0, amount_lte: 1000000 }
        decision: approve
      - decision: deny
  email.send:
    effect: "email:{message_id}"
    decision: allow
  payouts.send:
    effect: "payout:{payout_id}"
    decision: allow
  iam.grant_admin:
    decision: deny
"""

RACE_WORKERS = 4


class Remote:
    """A stand-in remote that remembers what it did and counts the calls that reached it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.ledger: dict[str, dict] = {}
        self.calls = 0
        self.lose_next_reply = False

    def act(self, key: str, body: dict, *, never_arrives: bool = False) -> dict:
        if never_arrives:  # the connection dropped before the request reached the remote
            raise ConnectionResetError(f"connection to {self.name} reset while sending")
        self.calls += 1
        self.ledger[key] = body
        if self.lose_next_reply:  # the remote acted, but its answer never came back
            self.lose_next_reply = False
            raise TimeoutError(f"no response from {self.name} after 30s")
        return {"id": f"re_{key}", **body}

    def lookup(self, effect_key: str) -> str:
        return "committed" if effect_key.split(":", 1)[1] in self.ledger else "not_executed"


def refund_at(stripe: Remote, **protect_options: object):
    """The protected refund tool most scenarios use, acting on the given stand-in remote."""
    import ctrlrun

    @ctrlrun.protect("stripe.refund", effect="refund:{payment_id}", **protect_options)  # type: ignore[arg-type]
    def refund(payment_id: str, amount: int) -> dict:
        return stripe.act(payment_id, {"amount": amount})

    return refund


def say(text: str = "") -> None:
    print(text, flush=True)


def heading(number: int, title: str) -> None:
    say()
    say(f"{number}. {title}")
    say("-" * (len(title) + 3))


def lost_reply() -> None:
    import ctrlrun

    heading(1, "A lost reply: the remote acted, the answer never came back")
    stripe = Remote("api.stripe.com")

    refund = refund_at(stripe, reconcile=stripe.lookup, reconcile_eagerly=True)

    with ctrlrun.context(agent="refund-agent"):
        try:
            stripe.lose_next_reply = True
            refund(payment_id="txn_9", amount=50000)
        except TimeoutError as exc:
            say(f"  refund txn_9 -> TimeoutError ({exc}): the outcome is AMBIGUOUS, never 'failed'")
            say("  the reconcile hook asked the remote at once (reconcile_eagerly=True): it has the refund")
        try:
            refund(payment_id="txn_9", amount=50000)
        except ctrlrun.DuplicateEffect as exc:
            say(f"  the agent retries -> DuplicateEffect: {exc}")
    say(f"  calls that reached the remote: {stripe.calls}")


def blocked_retry() -> None:
    import ctrlrun

    heading(2, "A dropped connection: the hook finds nothing, so the retry may run")
    mail = Remote("smtp.example.com")
    state = {"drop": True}

    @ctrlrun.protect("email.send", effect="email:{message_id}", reconcile=lambda k: mail.lookup(k))
    def send(message_id: str, to: str) -> dict:
        return mail.act(message_id, {"to": to}, never_arrives=state.pop("drop", False))

    with ctrlrun.context(agent="support-agent"):
        try:
            send(message_id="msg_41", to="ada@example.com")
        except ConnectionResetError as exc:
            say(f"  send msg_41 -> ConnectionResetError ({exc}): AMBIGUOUS, nobody knows yet")
        receipt = send(message_id="msg_41", to="ada@example.com")
        say("  the agent retries: the ambiguous record blocks it, so the hook is asked first;")
        say(f"  the remote has no msg_41 ('not_executed'), the record becomes FAILED, and the retry runs: {receipt['id']}")
    say(f"  calls that reached the remote: {mail.calls}")


def duplicate_after_commit() -> None:
    import ctrlrun

    heading(3, "A duplicate after a commit: the agent repeats itself")
    stripe = Remote("api.stripe.com")

    refund = refund_at(stripe)

    with ctrlrun.context(agent="refund-agent"):
        refund(payment_id="txn_10", amount=1200)
        say("  refund txn_10 -> committed")
        try:
            refund(payment_id="txn_10", amount=1200)
        except ctrlrun.DuplicateEffect as exc:
            say(f"  the same refund again -> DuplicateEffect ({exc.state})")
    say(f"  calls that reached the remote: {stripe.calls}")


def denied() -> None:
    import ctrlrun

    heading(4, "Denied by policy")
    stripe = Remote("api.stripe.com")
    iam = Remote("iam")

    refund = refund_at(stripe)

    @ctrlrun.protect("iam.grant_admin")
    def grant_admin(user: str) -> None:
        iam.act(user, {"role": "admin"})

    with ctrlrun.context(agent="refund-agent"):
        for call, label in ((lambda: refund(payment_id="txn_11", amount=9_000_000), "refund of 9,000,000 (above every band)"),
                            (lambda: grant_admin(user="mallory"), "grant admin to mallory")):
            try:
                call()
            except ctrlrun.ActionDenied as exc:
                say(f"  {label} -> ActionDenied: {exc}")
    say(f"  calls that reached the remotes: {stripe.calls + iam.calls}")


def unknown_action() -> None:
    import ctrlrun

    heading(5, "An action the policy does not list")
    db = Remote("postgres")

    @ctrlrun.protect("db.drop_table", effect="drop:{table}")
    def drop_table(table: str) -> None:
        db.act(table, {})

    with ctrlrun.context(agent="ops-agent"):
        try:
            drop_table(table="customers")
        except ctrlrun.ActionDenied as exc:
            say(f"  drop_table customers -> ActionDenied ({exc.reason}): anything unlisted is denied")
    say(f"  calls that reached the remote: {db.calls}")


def approval() -> None:
    import ctrlrun

    heading(6, "A large refund waits for a human")
    stripe = Remote("api.stripe.com")

    refund = refund_at(stripe)

    with ctrlrun.context(agent="refund-agent"):
        try:
            refund(payment_id="txn_20", amount=500000)
        except ctrlrun.ApprovalRequired as exc:
            request_id = exc.request_id
            say(f"  refund txn_20 of 500,000 -> ApprovalRequired: request {request_id}")
        answer = subprocess.run([sys.executable, "-m", "ctrlrun", "approve", request_id, "--by", "dana",
                                 "--note", "customer called; amount checked"],
                                capture_output=True, text=True, env=dict(os.environ))
        if answer.returncode != 0:
            raise SystemExit(f"the approval command failed: {answer.stderr}")
        say(f"  a human: ctrlrun approve {request_id} --by dana -> {answer.stdout.splitlines()[0].split(' for ')[0]}")
        with ctrlrun.with_approval(request_id):
            result = refund(payment_id="txn_20", amount=500000)
            say(f"  the agent retries inside with_approval -> ran: {result['id']}")
            try:
                refund(payment_id="txn_20", amount=900000)
            except ctrlrun.ApprovalMismatch as exc:
                say(f"  the same approval with one digit changed (900,000) -> ApprovalMismatch ({exc.reason})")
            try:
                refund(payment_id="txn_20", amount=500000)
            except ctrlrun.ApprovalMismatch as exc:
                say(f"  the used approval presented again -> ApprovalMismatch ({exc.reason})")
    say(f"  calls that reached the remote: {stripe.calls}")


def observe_mode() -> None:
    import json

    import ctrlrun
    from ctrlrun import store
    from ctrlrun.control import Control
    from ctrlrun.policy import parse_policy

    heading(8, "The same rules in observe mode: nothing refused, every receipt says what would have been")
    say("  (mode: observe is how a team adopts ctrlrun: run it beside production, read the receipts, then enforce)")
    observing = Control(policy=parse_policy(POLICY.replace("schema: ctrlrun.policy/v2",
                                                           "schema: ctrlrun.policy/v3\nmode: observe")))
    stripe, iam, db = Remote("api.stripe.com"), Remote("iam"), Remote("postgres")

    @ctrlrun.protect("stripe.refund", effect="refund:{payment_id}", control=observing)
    def refund(payment_id: str, amount: int) -> dict:
        return stripe.act(payment_id, {"amount": amount})

    @ctrlrun.protect("iam.grant_admin", control=observing)
    def grant_admin(user: str) -> None:
        iam.act(user, {"role": "admin"})

    @ctrlrun.protect("db.drop_table", effect="drop:{table}", control=observing)
    def drop_table(table: str) -> None:
        db.act(table, {})

    calls = ((lambda: refund(payment_id="txn_30", amount=9_000_000), "refund of 9,000,000"),
             (lambda: grant_admin(user="mallory"), "grant admin to mallory"),
             (lambda: drop_table(table="customers"), "drop_table customers"),
             (lambda: refund(payment_id="txn_31", amount=500000), "refund of 500,000"),
             (lambda: refund(payment_id="txn_32", amount=1200), "refund of 1,200"),
             (lambda: refund(payment_id="txn_32", amount=1200), "the same refund of 1,200 again"))
    with ctrlrun.context(agent="refund-agent"):
        for call, label in calls:
            call()
            receipt = json.loads(store.list_receipts(1)[0].document)
            would = receipt["would_have"]
            say(f"  {label} -> ran ({receipt['execution']}); enforcing would have said {would['decision']} "
                f"({would['reason']}), blocked: {would['blocked_reason'] or '-'}")
    say(f"  calls that reached the remotes: {stripe.calls + iam.calls + db.calls} of {len(calls)}")


def race(folder: Path) -> None:
    heading(7, f"{RACE_WORKERS} worker processes race for one payout")
    say("  (each worker first sends a warm-up payout of its own, so all of them are ready at the start line)")
    log = folder / "payout-calls.log"
    log.unlink(missing_ok=True)
    start_at = time.time() + 2.5  # every worker is imported and warmed up by then
    env = dict(os.environ)
    workers = [
        subprocess.Popen([sys.executable, "-m", "ctrlrun.demo", "--race-worker", str(folder), str(start_at), str(n)],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for n in range(RACE_WORKERS)
    ]
    for worker in workers:
        out, err = worker.communicate(timeout=120)
        if worker.returncode != 0:
            raise SystemExit(f"a race worker failed:\n{err}")
        say(f"  {out.strip()}")
    calls = log.read_text().split().count("po_77") if log.exists() else 0
    say(f"  calls for po_77 that reached the remote: {calls}")


def race_worker(folder: Path, start_at: float, number: int) -> None:
    import fcntl

    import ctrlrun

    @ctrlrun.protect("payouts.send", effect="payout:{payout_id}")
    def send_payout(payout_id: str, amount: int) -> str:
        with open(folder / "payout-calls.log", "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            handle.write(f"{payout_id}\n")
        return "sent"

    with ctrlrun.context(agent=f"payout-worker-{number}"):
        send_payout(payout_id=f"warmup_{number}", amount=1)  # opens the store before the start line
        while time.time() < start_at:
            time.sleep(0.001)
        try:
            send_payout(payout_id="po_77", amount=250_00)
            print(f"worker {number} (pid {os.getpid()}): sent payout po_77")
        except ctrlrun.DuplicateEffect as exc:
            print(f"worker {number} (pid {os.getpid()}): refused, DuplicateEffect ({exc.state})")


def main(argv: list[str]) -> None:
    if argv[:1] == ["--race-worker"]:
        os.chdir(argv[1])
        race_worker(Path(argv[1]), float(argv[2]), int(argv[3]))
        return
    folder = Path(argv[0])
    os.chdir(folder)
    for scenario in (lost_reply, blocked_retry, duplicate_after_commit, denied, unknown_action, approval):
        scenario()
    race(folder)
    observe_mode()
    import ctrlrun.store as store

    receipts = store.list_receipts()
    say()
    say(f"{len(receipts)} receipts written; the chain verifies: {store.verify().ok}")


if __name__ == "__main__":
    main(sys.argv[1:])
