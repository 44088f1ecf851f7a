"""ASGI entry point."""
import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")

from project.settings import require_secret_key  # noqa: E402

require_secret_key()
application = get_asgi_application()
