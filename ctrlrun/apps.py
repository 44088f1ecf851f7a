from __future__ import annotations

from django.apps import AppConfig


class CtrlrunConfig(AppConfig):
    name = "ctrlrun"
    verbose_name = "ctrlrun: execution safety"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401  (registers the system checks)
