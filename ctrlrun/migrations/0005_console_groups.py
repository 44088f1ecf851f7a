"""Kept for its name, and does nothing: the console's groups are made after ``migrate`` instead.

This migration once made the groups (approvers, resolvers, auditors) itself, depending on auth's
and contenttypes' migrations only where those apps were installed. A plain script's store has no
auth (its Django runs ctrlrun alone), so it recorded 0005 as applied with no such dependency; once
that store was opened in the console, with auth installed, the same 0005 named auth's migrations
as its dependencies, applied after it, and ``migrate`` stopped with InconsistentMigrationHistory.

Now 0005 depends on ctrlrun's own migrations only, on every database, so a store made anywhere
stays consistent anywhere; databases that applied the old 0005 keep its groups (nothing here
removes them). The groups are made, where auth is installed, by a ``post_migrate`` handler
(``ctrlrun.apps.create_console_groups``), after auth has made the permissions.
"""
from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("ctrlrun", "0004_console_permissions")]
    operations: list = []
