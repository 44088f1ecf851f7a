"""Helpers for tests that start separate OS processes on the test store."""
from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def store_environment() -> dict[str, str]:
    """Environment variables that point a standalone ctrlrun process at the test database."""
    from django.db import connection

    settings_dict = connection.settings_dict
    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL",
                                                           "CTRLRUN_STORE_URL", "CTRLRUN_STATE")}
    env["PYTHONPATH"] = str(REPO)
    if connection.vendor == "sqlite":
        env["CTRLRUN_STATE"] = settings_dict["NAME"]
    else:
        user = settings_dict.get("USER") or "postgres"
        password = f":{settings_dict['PASSWORD']}" if settings_dict.get("PASSWORD") else ""
        host = settings_dict.get("HOST") or "127.0.0.1"
        port = settings_dict.get("PORT") or 5432
        env["CTRLRUN_STORE_URL"] = f"postgresql://{user}{password}@{host}:{port}/{settings_dict['NAME']}"
    return env


def evidence_guard():
    """The migration module that installs and removes the append-only triggers."""
    import importlib

    return importlib.import_module("ctrlrun.migrations.0006_evidence_append_only")


class evidence_unguarded:
    """Drop the append-only triggers for a block, as an attacker with DDL rights could, then restore them."""

    def __enter__(self):
        from django.db import connection

        evidence_guard().remove(connection)

    def __exit__(self, *exc):
        from django.db import connection

        evidence_guard().install(connection)
        return False
