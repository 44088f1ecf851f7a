"""The store's value types and the messages are pure: they import without Django."""
from __future__ import annotations

import subprocess
import sys
import textwrap


def test_values_and_messages_import_without_django():
    """ctrlrun.values and ctrlrun.messages load in a fresh interpreter where importing Django fails."""
    script = textwrap.dedent("""
        import sys
        sys.modules["django"] = None  # any 'import django...' now raises ImportError
        import ctrlrun.values as values, ctrlrun.messages as messages
        assert not [name for name in sys.modules if name == "django" and sys.modules[name] is not None]
        call = values.Call.__dataclass_fields__
        print(sorted(values.__all__)[0], "effect_key" in call, messages.command("reconcile"))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() [:2] == ["ApprovalView", "True"]
    assert "'ctrlrun reconcile' (or 'python manage.py reconcile')" in done.stdout


def test_the_store_reexports_every_value_type():
    """store.Call and the rest are the values module's own classes (one definition)."""
    script = textwrap.dedent("""
        import django, os
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
        django.setup()
        from ctrlrun import store, values
        assert all(getattr(store, name) is getattr(values, name) for name in values.__all__)
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
