import ctrlrun

ledger: dict[str, dict] = {}                       # what the remote holds
calls: list[str] = []


def refund_at_stripe(payment_id: str, amount: int) -> dict:
    calls.append(payment_id)
    ledger[payment_id] = {"id": f"re_{payment_id}", "amount": amount}
    raise TimeoutError("no response from api.stripe.com after 30s")


def ask_stripe(effect_key: str) -> ctrlrun.ReconcileOutcome:
    payment_id = effect_key.removeprefix("refund:")
    return "committed" if payment_id in ledger else "not_executed"


@ctrlrun.protect(
    "stripe.refund",
    effect="refund:{payment_id}",
    reconcile=ask_stripe,
    reconcile_eagerly=True,
)
def refund(payment_id: str, amount: int) -> dict:
    return refund_at_stripe(payment_id, amount)


with ctrlrun.context(agent="refund-agent"):
    try:
        refund(payment_id="txn_9", amount=50000)
    except TimeoutError:
        print("the reply was lost; the hook asked the remote")
    try:
        refund(payment_id="txn_9", amount=50000)
    except ctrlrun.DuplicateEffect:
        print("retry refused as a duplicate: the remote had it")
    else:
        raise SystemExit("the retry ran; the refund happened twice")

print("remote refund calls:", len(calls))
