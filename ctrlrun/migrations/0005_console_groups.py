"""The three groups of the console: approvers, resolvers and auditors (view only).

Only where django.contrib.auth is installed: a standalone store has no users and no groups, so
there this migration does nothing (and does not depend on auth's migrations).
"""
from django.apps import apps as global_apps
from django.db import migrations

HAS_AUTH = global_apps.is_installed("django.contrib.auth") and global_apps.is_installed(
    "django.contrib.contenttypes"
)

VIEW_ALL = [
    "view_approval", "view_effectrecord", "view_event", "view_receipt", "view_policydocument",
]
GROUPS = {
    "approvers": VIEW_ALL + ["decide_approval"],
    "resolvers": VIEW_ALL + ["resolve_effect"],
    "auditors": VIEW_ALL,
}


def create_groups(apps, schema_editor):
    if not HAS_AUTH:
        return
    from django.contrib.auth.management import create_permissions

    # Permissions are normally created after all migrations ran; make sure ours exist now.
    app_config = apps.get_app_config("ctrlrun")
    app_config.models_module = True
    create_permissions(app_config, apps=apps, verbosity=0, using=schema_editor.connection.alias)
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    alias = schema_editor.connection.alias
    for name, codenames in GROUPS.items():
        group, _ = Group.objects.using(alias).get_or_create(name=name)
        permissions = Permission.objects.using(alias).filter(content_type__app_label="ctrlrun", codename__in=codenames)
        group.permissions.add(*permissions)


def remove_groups(apps, schema_editor):
    if not HAS_AUTH:
        return
    apps.get_model("auth", "Group").objects.using(schema_editor.connection.alias).filter(name__in=GROUPS).delete()


class Migration(migrations.Migration):
    dependencies = [("ctrlrun", "0004_console_permissions")] + (
        [("auth", "0012_alter_user_first_name_max_length"), ("contenttypes", "0002_remove_content_type_name")]
        if HAS_AUTH else []
    )
    operations = [migrations.RunPython(create_groups, remove_groups)]
