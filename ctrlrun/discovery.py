"""Finding the modules that register things (reconcile hooks, resumers): each installed app's
``CTRLRUN_TOOLS_MODULE`` (``tools.py``, the way Django finds ``admin.py``), then the modules named
by settings or ``--import``. One way for both commands: a module that is missing, misnamed or
raises while it is imported is one line naming it, never its traceback."""
from __future__ import annotations

import importlib
from collections.abc import Iterable

from . import conf
from .errors import InvalidArgument

__all__ = ["import_modules"]


def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:2000]


def import_modules(kind: str, modules: Iterable[str]) -> list[str]:
    """Import every installed app's tools module, then ``modules``; return the names imported.

    ``kind`` names what the modules register, for the error (``hook``, ``resumer``)."""
    from django.utils.module_loading import autodiscover_modules

    tools = conf.tools_module()
    if tools:
        autodiscover_modules(tools)
    imported = []
    for module in modules:
        name = repr(module).encode("ascii", "backslashreplace").decode()[:300]
        try:
            importlib.import_module(module)
        except (ImportError, TypeError, ValueError) as exc:  # TypeError: a relative name like '.x'
            raise InvalidArgument(f"could not import {kind} module {name}: {_one_line(exc)}") from None
        except Exception as exc:  # noqa: BLE001 - the module itself raised while it was imported
            raise InvalidArgument(f"could not import {kind} module {name}: it raised {_one_line(exc)}") from None
        imported.append(module)
    return imported
