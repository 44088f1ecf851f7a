"""Settings of the Django project that hosts ctrlrun's console and commands.

Everything that differs between machines comes from the environment (django-environ):

- ``DATABASE_URL``: default a SQLite file beside manage.py (``db.sqlite3``); SQLite or PostgreSQL
  only (anything else is refused with ImproperlyConfigured, which manage.py prints as one line);
- ``SECRET_KEY``: required to serve pages with ``DEBUG`` off (wsgi/asgi refuse to start without it);
- ``DEBUG`` (default off), ``ALLOWED_HOSTS`` (comma-separated);
- ``CTRLRUN_POLICY`` (default ``ctrlrun.yaml`` beside manage.py), ``CTRLRUN_ENVIRONMENT``,
  ``CTRLRUN_LEASE_SECONDS``, ``CTRLRUN_APPROVAL_TTL_SECONDS``, ``CTRLRUN_HOOK_MODULES``.
"""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

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

#: The database engines ctrlrun's SQL, locks and append-only triggers are written for.
SUPPORTED_ENGINES = ("django.db.backends.sqlite3", "django.db.backends.postgresql",
                     "django.contrib.gis.db.backends.postgis")


def _shown_url(url: str) -> str:
    """The URL as given, its password replaced by ***, for an error message."""
    try:
        parts = urlsplit(url)
        if parts.password is not None:
            host = parts.hostname or ""
            host += f":{parts.port}" if parts.port else ""
            netloc = f"{parts.username or ''}:***@{host}"
            return urlunsplit(parts._replace(netloc=netloc))
    except ValueError:  # an unreadable port or netloc: say nothing of it
        return "an unreadable URL"
    return url


def store_database(url: str | None) -> dict[str, Any]:
    """The Django DATABASES entry for ``DATABASE_URL``; refused unless SQLite or PostgreSQL."""
    default = f"sqlite:///{BASE_DIR / 'db.sqlite3'}"
    with warnings.catch_warnings():  # django-environ warns of an unknown scheme: the refusal below says more
        warnings.simplefilter("ignore")
        config = environ.Env.db_url_config(default if url is None else url)
    engine = config.get("ENGINE", "")
    if engine not in SUPPORTED_ENGINES:
        raise ImproperlyConfigured(
            f"ctrlrun's store must be SQLite or PostgreSQL, but DATABASE_URL is {_shown_url(url or '')}"
            f" ({f'the {engine} engine' if engine else 'no database engine recognised'}). Set DATABASE_URL to "
            f"sqlite:////absolute/path/to/db.sqlite3 or postgresql://USER@HOST:5432/NAME, or unset it for "
            f"db.sqlite3 beside manage.py."
        )
    return config


DATABASES = {"default": store_database(env.str("DATABASE_URL", default=None))}
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

# Logging goes to stderr, where gunicorn and runserver users read it. Django's own default sends a
# 500 (django.request, ERROR) to the console only with DEBUG on, and by mail otherwise (to ADMINS,
# which this project has none of): with DEBUG off a 500 was logged nowhere. Here it is always
# logged, with its traceback; with DEBUG on, 4xx warnings too, as Django does. django.server
# (runserver's request lines) is left to Django: it already logs to stderr whatever DEBUG is.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"require_debug_false": {"()": "django.utils.log.RequireDebugFalse"}},
    "formatters": {"request": {"format": "{asctime} {levelname} {name}: {message}", "style": "{"}},
    "handlers": {
        "console": {"class": "logging.StreamHandler"},
        "stderr": {"class": "logging.StreamHandler", "stream": "ext://sys.stderr", "formatter": "request"},
        # Django's default, kept: mails a 500 to ADMINS when there are any and DEBUG is off.
        "mail_admins": {"class": "django.utils.log.AdminEmailHandler", "level": "ERROR",
                        "filters": ["require_debug_false"]},
    },
    "loggers": {
        "ctrlrun": {"handlers": ["console"], "level": env.str("CTRLRUN_LOG_LEVEL", default="WARNING")},
        # Not propagated: the "django" logger's console handler would print it a second time with DEBUG on.
        "django.request": {"handlers": ["stderr", "mail_admins"], "level": "WARNING" if DEBUG else "ERROR",
                           "propagate": False},
    },
}
