"""Test settings: the project's settings, with the database from DATABASE_URL (default SQLite).

The SQLite test database is a real file, not memory, so that the OS processes some tests spawn
open the very same store.
"""
import os
import tempfile

os.environ.setdefault("SECRET_KEY", "tests-only-secret-key")

from project.settings import *  # noqa: E402,F401,F403
from project.settings import DATABASES  # noqa: E402
from ctrlrun.standalone import sqlite_options  # noqa: E402

if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    _folder = tempfile.mkdtemp(prefix="ctrlrun-tests-")
    DATABASES["default"]["NAME"] = os.path.join(_folder, "main.db")
    DATABASES["default"]["TEST"] = {"NAME": os.path.join(_folder, "test.db")}

# A second database for ``store.using("other")`` (tests/integration/test_store_alias.py): always a
# SQLite file of its own, whichever database the suite runs on; created only for the tests that
# ask for it (``databases=["default", "other"]``).
_other = tempfile.mkdtemp(prefix="ctrlrun-tests-other-")
DATABASES["other"] = {"ENGINE": "django.db.backends.sqlite3", "NAME": os.path.join(_other, "other.db"),
                      "TEST": {"NAME": os.path.join(_other, "test-other.db")},
                      "OPTIONS": sqlite_options(), "ATOMIC_REQUESTS": False}

STATIC_ROOT = tempfile.mkdtemp(prefix="ctrlrun-static-")  # exists, so whitenoise has nothing to warn about
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast logins in tests
CTRLRUN_POLICY = os.path.join(os.path.dirname(__file__), "policies", "default.yaml")

# Plain static files in tests: no collectstatic manifest is needed for {% static %}.
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}

# One signing key for the test process and every OS process a test starts (they inherit the
# environment), as every process of one production store must share one.
CTRLRUN_SIGNING_KEY = os.environ.setdefault("CTRLRUN_SIGNING_KEY", "tests-only-signing-key-0123456789abcdef")
