from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.apps import apps as global_apps

#: What the console's readers may see: every ctrlrun model, read-only.
VIEW_ALL = ["view_approval", "view_effectrecord", "view_event", "view_receipt", "view_policydocument",
            "view_delegation"]
#: The console's groups and the ctrlrun permissions each is made with.
CONSOLE_GROUPS = {
    "approvers": VIEW_ALL + ["decide_approval"],
    "resolvers": VIEW_ALL + ["resolve_effect"],
    "auditors": VIEW_ALL,
}


def create_console_groups(*, apps: Any = global_apps, using: str = "default", verbosity: int = 1) -> list[str]:
    """Make each console group that does not exist yet, with its permissions; return the names made.

    A ``post_migrate`` handler (every ``migrate``, and every test flush), so the groups appear
    on the first ``migrate`` of any database that has auth's tables: a project's, or a store a
    plain script made (which has ctrlrun's tables only until then). Nothing happens where auth or
    contenttypes is not installed (a plain script's own Django) or not routed to this database.

    A group that exists is left exactly as it is: it is the operators' from the moment it is
    made. Adding back a permission an operator took away (say ``decide_approval`` from
    approvers, during an incident) at the next deploy's ``migrate`` would undo their decision
    without anyone seeing it; and nothing is ever removed. A group someone deleted is made again,
    empty of members, so it grants nobody anything until an operator adds people to it.
    """
    if not all(global_apps.is_installed(f"django.contrib.{app}") for app in ("auth", "contenttypes")):
        return []
    from django.contrib.auth.management import create_permissions
    from django.db import router

    try:
        Group = apps.get_model("auth", "Group")
        Permission = apps.get_model("auth", "Permission")
    except LookupError:  # auth's models are not in this migration state (migrate of another app only)
        return []
    if not router.allow_migrate_model(using, Group):
        return []
    # auth makes permissions in its own post_migrate handler; that may run after this one (an
    # INSTALLED_APPS order with ctrlrun before auth), so make ctrlrun's here first (idempotent).
    create_permissions(global_apps.get_app_config("ctrlrun"), verbosity=0, apps=apps, using=using)
    made = []
    for name, codenames in CONSOLE_GROUPS.items():
        if Group.objects.using(using).filter(name=name).exists():
            continue
        group = Group.objects.using(using).create(name=name)
        group.permissions.add(*Permission.objects.using(using).filter(content_type__app_label="ctrlrun",
                                                                       codename__in=codenames))
        made.append(name)
    if made and verbosity >= 2:
        print(f"ctrlrun: made the console group(s) {', '.join(made)}")
    return made


class CtrlrunConfig(AppConfig):
    name = "ctrlrun"
    verbose_name = "ctrlrun: execution safety"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.core.signals import setting_changed
        from django.db.models.signals import post_migrate

        from . import checks  # noqa: F401  (registers the system checks)
        from .conf import forget_cached_settings

        setting_changed.connect(forget_cached_settings, dispatch_uid="ctrlrun-conf-cache")
        from django.db.backends.signals import connection_created

        from .store.base import connection_made

        # Each new database connection: a SQLite store's WAL is checkpointed off the call's path.
        connection_created.connect(connection_made, dispatch_uid="ctrlrun-store-connection")
        # Once per migrate (sender: this app), after every migration has run.
        post_migrate.connect(_post_migrate, sender=self, dispatch_uid="ctrlrun-console-groups")
        from django.conf import settings

        if getattr(settings, "CTRLRUN_RESUME_ON_ANSWER", False):  # docs/resumption.md
            from .resumption import connect_signal_receiver

            connect_signal_receiver()
        if getattr(settings, "CTRLRUN_NOTIFY_APPROVERS", False):  # docs/approvals.md#notifications
            from . import notify

            notify.connect_signal_receiver()
        _register_jsonl_sink()


#: The process-wide JSONL sink ``CTRLRUN_JSONL_DIR`` asked for (docs/observability.md), once made.
_jsonl_sink: Any = None


def _register_jsonl_sink() -> None:
    global _jsonl_sink
    from . import conf

    directory = conf.jsonl_directory()
    if directory is None or _jsonl_sink is not None:
        return
    from . import observers
    from .sinks import JSONLEventSink

    _jsonl_sink = JSONLEventSink(directory)
    observers.register(_jsonl_sink)


def _post_migrate(sender: AppConfig, *, apps: Any = global_apps, using: str = "default", verbosity: int = 1,
                  plan: Any = None, **_: Any) -> None:
    create_console_groups(apps=apps, using=using, verbosity=verbosity)
    if plan is not None:  # a migrate (a flush sends no plan: its tooling puts the guard back itself)
        repair_guard(using, verbosity=verbosity)


def repair_guard(using: str, *, verbosity: int = 1) -> int | None:
    """With every ctrlrun migration applied on ``using``, a guard that is missing, older than this code's
    or short of a trigger goes back to the newest version (``guards.repair``): what ``manage.py check``'s
    ctrlrun.W005 tells to run ``migrate ctrlrun`` for."""
    import sys

    from django.db import DatabaseError, connections

    from . import guards

    try:
        installed = guards.repair(connections[using])
    except DatabaseError as exc:  # a role that may not make triggers (not the tables' owner): said, not raised
        reason = " ".join(str(exc).split()) or type(exc).__name__
        print(f"ctrlrun: could not put guard version {guards.CURRENT} back on the database {using!r}: {reason} "
              f"(run `migrate ctrlrun` as the owner of ctrlrun's tables)", file=sys.stderr)
        return None
    if installed is not None and verbosity >= 1:
        print(f"ctrlrun: installed guard version {installed} on the database {using!r} (it was missing or older)")
    return installed
