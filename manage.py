#!/usr/bin/env python
"""Django's command-line utility for the ctrlrun project."""
from __future__ import annotations

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import execute_from_command_line

    try:
        settings.INSTALLED_APPS  # loads the settings module: a refusal there is one line, not a traceback
    except ImproperlyConfigured as exc:
        message = " ".join(str(exc).split())
        print(f"Error: {message}", file=sys.stderr)
        sys.exit(1)
    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
