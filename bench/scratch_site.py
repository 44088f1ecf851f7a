"""A scratch ctrlrun site for a bench's child process: a fresh folder holding ``policy`` as its
``ctrlrun.yaml``, Django set up on the test settings (the database the child's environment names),
the test environment's client allowed, and every migration applied. Shared by ``front_page.py`` and
``index_plans.py``."""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def scratch_site(name: str, policy: str) -> Path:
    """Set the site up in this process (once) and return its folder."""
    sys.path.insert(0, str(REPO))
    folder = Path(tempfile.mkdtemp(prefix=f"ctrlrun-bench-{name}-"))
    (folder / "ctrlrun.yaml").write_text(policy)
    os.environ["CTRLRUN_POLICY"] = str(folder / "ctrlrun.yaml")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command
    from django.test.utils import setup_test_environment

    settings.CTRLRUN_POLICY = str(folder / "ctrlrun.yaml")
    settings.ALLOWED_HOSTS = ["*"]
    setup_test_environment()
    call_command("migrate", verbosity=0)
    return folder
