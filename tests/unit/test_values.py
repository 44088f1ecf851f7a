"""The store's value types: one definition, re-exported by the store. That they (and every other pure
module) import without Django is tests/unit/test_pure_modules.py."""
from __future__ import annotations

import subprocess
import sys
import textwrap


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
