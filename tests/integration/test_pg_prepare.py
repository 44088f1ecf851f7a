"""The store's own statements on PostgreSQL: server-side bound and prepared once a session
(``CTRLRUN_PG_PREPARE``, on by default), read back from the server's ``pg_prepared_statements`` on the
store's own connection; none with the setting off, and never a statement of Django's."""
from __future__ import annotations

import re

import pytest
from django.db import connection

import ctrlrun
from ctrlrun import conf, store
from ctrlrun.errors import InvalidArgument
from ctrlrun.models import EffectRecord



def _on_sqlite(refund, count: int = 4) -> bool:
    """SQLite has no server to prepare on (sqlite3 keeps its own per-connection statement cache): there
    the setting changes nothing, and the calls commit as ever. True when this ran on SQLite."""
    if connection.vendor != "sqlite":
        return False
    _calls(refund, count)
    assert EffectRecord.objects.filter(state="committed").count() == count
    connection.ensure_connection()
    assert type(store.sqlite.driver_cursor(connection.connection)) is type(connection.connection.cursor())
    return True


def _prepared() -> dict[str, int]:
    """The session's protocol-level prepared statements: text (``$n`` read back as ``%s``) -> plans made
    or reused (generic + custom), as the server counts them."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement, generic_plans + custom_plans FROM pg_prepared_statements "
                       "WHERE NOT from_sql")
        return {re.sub(r"\$\d+", "%s", text): plans for text, plans in cursor.fetchall()}


def _fresh_session() -> None:
    """A new connection, so the server's list holds this test's statements only."""
    connection.close()
    connection.ensure_connection()


def _calls(refund, count: int = 4) -> None:
    for index in range(count):
        refund(payment_id=f"txn_{index}", amount=100)
    with pytest.raises(ctrlrun.ActionDenied):
        refund(payment_id="txn_big", amount=10**9)


@pytest.mark.usefixtures("store_db", "agent")
def test_allowed_calls_leave_ctrlruns_statements_prepared_on_the_stores_connection(refund):
    if _on_sqlite(refund):
        return
    _fresh_session()
    _calls(refund)
    prepared = _prepared()
    for name in ("OPEN_POSTGRESQL", "EFFECT_INSERT", "OUTCOME_UPDATE_NOW", "HEAD_TAKE"):
        assert getattr(store.sql, name) in prepared, f"sql.{name} is not prepared: {sorted(prepared)}"
    # prepared once, then executed again and again: the server counts a plan for every execution
    assert prepared[store.sql.OPEN_POSTGRESQL] >= 4
    assert prepared[store.sql.EFFECT_INSERT] >= 4
    appends = [text for text in prepared if text.startswith("WITH e AS (") and text.endswith(store.sql.HEAD_MOVE)]
    assert appends, "the evidence append (events, receipt, head) is not prepared"


@pytest.mark.usefixtures("store_db", "agent")
def test_djangos_own_statements_stay_unprepared(refund):
    """psycopg prepares nothing on Django's connection (``prepare_threshold=None``); the store lifts
    that for its own statements only, so an ORM query repeated stays unprepared."""
    if _on_sqlite(refund, count=2):
        return
    _fresh_session()
    _calls(refund, count=2)
    before = _prepared()
    for _ in range(12):
        assert EffectRecord.objects.filter(pk="refund:txn_0").exists()
    assert _prepared().keys() == before.keys()
    assert connection.connection.prepare_threshold is None


@pytest.mark.usefixtures("store_db", "agent")
def test_with_the_setting_off_nothing_is_prepared(refund, settings):
    settings.CTRLRUN_PG_PREPARE = False
    if _on_sqlite(refund):
        return
    _fresh_session()
    _calls(refund)
    assert _prepared() == {}
    assert EffectRecord.objects.filter(state="committed").count() == 4


@pytest.mark.usefixtures("store_db", "agent")
def test_the_environment_variable_turns_it_off_too(refund, monkeypatch):
    monkeypatch.setenv("CTRLRUN_PG_PREPARE", "off")
    conf.forget_cached_settings()
    try:
        if _on_sqlite(refund, count=2):
            return
        _fresh_session()
        _calls(refund, count=2)
        assert _prepared() == {}
    finally:
        monkeypatch.delenv("CTRLRUN_PG_PREPARE")
        conf.forget_cached_settings()


def test_the_setting_is_on_unless_turned_off(settings, monkeypatch):
    conf.forget_cached_settings()
    assert conf.pg_prepare() is True
    for text, expected in (("0", False), ("OFF", False), ("false", False), ("1", True), ("on", True)):
        monkeypatch.setenv("CTRLRUN_PG_PREPARE", text)
        conf.forget_cached_settings()
        assert conf.pg_prepare() is expected
    settings.CTRLRUN_PG_PREPARE = True  # the setting wins over the variable
    assert conf.pg_prepare() is True
    conf.forget_cached_settings()


def test_a_bad_value_is_one_clear_sentence(settings, monkeypatch):
    monkeypatch.setenv("CTRLRUN_PG_PREPARE", "maybe")
    conf.forget_cached_settings()
    with pytest.raises(InvalidArgument, match=r"CTRLRUN_PG_PREPARE must be on or off .*'maybe'"):
        conf.pg_prepare()
    monkeypatch.delenv("CTRLRUN_PG_PREPARE")
    settings.CTRLRUN_PG_PREPARE = "yes"
    with pytest.raises(InvalidArgument, match=r"settings.CTRLRUN_PG_PREPARE must be True or False, got 'yes'"):
        conf.pg_prepare()
    del settings.CTRLRUN_PG_PREPARE
    conf.forget_cached_settings()
