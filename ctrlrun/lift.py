"""The retention lock's hash chain (guard v9's only scoped lift; docs/retention.md): ``H^k(seed)``, with
``H`` SHA-256 and the seed an HMAC under ctrlrun's signing key. Used by the store's retention module
(to open the lock) and by the guard's install (to write the lock row before the triggers)."""
from __future__ import annotations

import hashlib
from typing import Any

from . import signing

#: How many prunes (batches) one lock row allows: the length of its hash chain.
CHAIN_LENGTH = 100_000
LIFT_DOMAIN = "ctrlrun.retention.lift/v1"
LOCK_TABLE = "ctrlrun_retentionlock"


def sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def links(low: int, high: int) -> dict[int, str]:
    """``H^k(seed)`` for ``low <= k <= high``, in one pass of ``high`` hashes."""
    value, out = signing.sign(LIFT_DOMAIN, ["seed"]), {}
    for k in range(1, high + 1):
        value = sha(value)
        if k >= low:
            out[k] = value
    return out


def seed_lock(connection: Any) -> None:
    """Write the lock row if the table has none (the migration, a test database's flush), before the guard
    is installed: with the guard in place nothing inserts it."""
    if LOCK_TABLE not in connection.introspection.table_names():
        return
    with connection.cursor() as cursor:
        cursor.execute(f'SELECT COUNT(*) FROM "{LOCK_TABLE}"')
        if cursor.fetchone()[0]:
            return
        digest = links(CHAIN_LENGTH, CHAIN_LENGTH)[CHAIN_LENGTH]
        cursor.execute(f'INSERT INTO "{LOCK_TABLE}" ("id", "digest", "remaining", "open", "key_id") '
                       "VALUES (1, %s, %s, %s, %s)", [digest, CHAIN_LENGTH, False, signing.key_id()])
