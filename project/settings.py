"""Settings of the Django project that hosts ctrlrun's console and commands.

Everything that differs between machines comes from the environment (django-environ):

- ``DATABASE_URL``: default a SQLite file beside manage.py (``db.sqlite3``);
- ``SECRET_KEY``: required to serve pages with ``DEBUG`` off (wsgi/asgi refuse to start without it);
- ``DEBUG`` (default off), ``ALLOWED_HOSTS`` (comma-separated);
- ``CTRLRUN_POLICY`` (default ``ctrlrun.yaml`` beside manage.py), ``CTRLRUN_ENVIRONMENT``,
  ``CTRLRUN_LEASE_SECONDS``, ``CTRLRUN_APPROVAL_TTL_SECONDS``, ``CTRLRUN_HOOK_MODULES``.
"""
from __future__ import annotations

from pathlib import Path

import environ
from django.core.exceptions import ImproperlyConfigured

from ctrlrun.standalone import sqlite_options

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()
environ.Env.read_env(BASE_DIR / ".env") if (BASE_DIR / ".env").exists() else None

DEBUG = env.bool("DEBUG", default=False)
# Commands (demo, receipts, reconcile...) run without a key; serving pages does not: wsgi.py and
# asgi.py refuse to start with DEBUG off and no SECRET_KEY (require_secret_key below).
SECRET_KEY = env.str("SECRET_KEY", default="")
if not SECRET_KEY and DEBUG:
    SECRET_KEY = "insecure-local-development-key-only"  # DEBUG only: never used in production


def require_secret_key() -> None:
    """Refuse to serve with DEBUG off and no SECRET_KEY (sessions and CSRF depend on it)."""
    if not SECRET_KEY:
        raise ImproperlyConfigured(
            "SECRET_KEY is not set and DEBUG is off. Set SECRET_KEY in the environment (or in .env beside "
            "manage.py), or set DEBUG=1 for a local try-out."
        )


ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["localhost", "127.0.0.1"] if DEBUG else [])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "ctrlrun",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",  # serves collectstatic's output under gunicorn
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "project.urls"
WSGI_APPLICATION = "project.wsgi.application"
ASGI_APPLICATION = "project.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {"default": env.db_url("DATABASE_URL", default=f"sqlite:///{BASE_DIR / 'db.sqlite3'}")}
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    # IMMEDIATE transactions, WAL and a busy timeout: ctrlrun's serialisation on SQLite.
    DATABASES["default"].setdefault("OPTIONS", {}).update(sqlite_options())
else:
    # Reuse connections for a minute and check them before use, so a restarted database is
    # picked up again without restarting the process.
    DATABASES["default"]["CONN_MAX_AGE"] = env.int("CONN_MAX_AGE", default=60)
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
# ctrlrun runs its own short transactions; a request-wide one would swallow its evidence.
DATABASES["default"]["ATOMIC_REQUESTS"] = False

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"
LANGUAGE_CODE = "en-us"
USE_I18N = True

STATIC_URL = "static/"
STATIC_ROOT = env.path("STATIC_ROOT", default=BASE_DIR / "staticfiles")
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    # Compressed, content-hashed files after `collectstatic`; plain finders while DEBUG is on.
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage" if not DEBUG
                    else "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
WHITENOISE_USE_FINDERS = WHITENOISE_AUTOREFRESH = DEBUG  # `runserver` without collectstatic
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])
SESSION_COOKIE_SECURE = env.bool("SESSION_COOKIE_SECURE", default=False)
CSRF_COOKIE_SECURE = env.bool("CSRF_COOKIE_SECURE", default=False)

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

# ctrlrun
CTRLRUN_POLICY = env.str("CTRLRUN_POLICY", default=env.str("CTRLRUN_CONFIG", default=str(BASE_DIR / "ctrlrun.yaml")))
CTRLRUN_ENVIRONMENT = env.str("CTRLRUN_ENVIRONMENT", default="production")
CTRLRUN_LEASE_SECONDS = env.int("CTRLRUN_LEASE_SECONDS", default=300)
CTRLRUN_APPROVAL_TTL_SECONDS = env.int("CTRLRUN_APPROVAL_TTL_SECONDS", default=900)
CTRLRUN_HOOK_MODULES = env.list("CTRLRUN_HOOK_MODULES", default=[])

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"ctrlrun": {"handlers": ["console"], "level": env.str("CTRLRUN_LOG_LEVEL", default="WARNING")}},
}
