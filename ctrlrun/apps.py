from __future__ import annotations

from django.apps import AppConfig


class CtrlrunConfig(AppConfig):
    name = "ctrlrun"
    verbose_name = "ctrlrun: execution safety"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.core.signals import setting_changed

        from . import checks  # noqa: F401  (registers the system checks)
        from .conf import forget_cached_settings

        setting_changed.connect(forget_cached_settings, dispatch_uid="ctrlrun-conf-cache")
