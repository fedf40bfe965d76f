"""Load a plugin object named by a dotted path `package.module:attribute`.

Plugins are how new environments and reward functions join a run: the config names them and
`load_object` imports them, with errors that say which part of the path is wrong.
"""

from __future__ import annotations

import importlib
import re
from typing import Any

_DOTTED = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$")


class PluginError(ValueError):
    """A plugin path could not be turned into the object it names."""


def load_object(path: str, *, what: str) -> Any:
    """Import `package.module:attribute` (the attribute may be dotted: `mod:Class.factory`).

    `what` names the kind of object in error messages ("environment", "reward function").
    """
    if not _DOTTED.match(path):
        raise PluginError(f"{what} {path!r} is not a plugin path like mypkg.module:name")
    module_name, _, attr_path = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or module_name
        if module_name == missing or module_name.startswith(missing + "."):
            raise PluginError(f"{what} {path!r}: no module named {missing!r} (is it installed or on PYTHONPATH?)") from exc
        raise PluginError(f"{what} {path!r}: importing {module_name!r} failed: {exc}") from exc
    except Exception as exc:
        raise PluginError(f"{what} {path!r}: importing {module_name!r} failed: {type(exc).__name__}: {exc}") from exc
    obj: Any = module
    for part in attr_path.split("."):
        if not hasattr(obj, part):
            public = sorted(n for n in dir(module) if not n.startswith("_"))
            hint = f"; it defines: {', '.join(public[:20])}" if public else ""
            raise PluginError(f"{what} {path!r}: module {module_name!r} has no attribute {attr_path!r}{hint}")
        obj = getattr(obj, part)
    return obj
