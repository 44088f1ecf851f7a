"""WSGI entry point: ``gunicorn project.wsgi``."""
import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")

from project.settings import require_secret_key  # noqa: E402

require_secret_key()
application = get_wsgi_application()
