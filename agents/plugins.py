"""The plugin registry: the environments, reward functions and tools a config may name by dotted path.

A config names a plugin as `package.module:attribute`, but naming is not importing. Only the
operator decides which code runs: the paths listed in the `TROUPE_ENVIRONMENTS`,
`TROUPE_REWARD_FUNCTIONS` and `TROUPE_TOOLS` environment variables (comma-separated) are imported once, when the
process first needs the registry (the web app and the worker do it at start-up), and `lookup`
only ever reads what was registered. A path nobody registered is refused with a `PluginError`
before anything is imported, so a config cannot run a module's import-time code by naming it.

Plugin code is the operator's, yet it may still raise anything, `SystemExit` and
`KeyboardInterrupt` included. Registered objects are wrapped by `guard`: whatever escapes a
plugin call becomes a `PluginCrash` (an ordinary exception), which fails the one run or request
that made the call and never the process around it.

The command line (`python -m training run`) is the operator's own: it registers the plugins its
config names before it runs (see `training.__main__`).
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
import re
import threading
import traceback
from collections.abc import Sequence
from typing import Any

log = logging.getLogger(__name__)

DOTTED = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$")
"""`package.module:attribute` (the attribute may be dotted: `mod:Class.factory`)."""

ENVIRONMENT = "environment"
REWARD_FUNCTION = "reward function"
TOOL = "tool"
ENV_VARS = {ENVIRONMENT: "TROUPE_ENVIRONMENTS", REWARD_FUNCTION: "TROUPE_REWARD_FUNCTIONS", TOOL: "TROUPE_TOOLS"}
"""Kind -> the environment variable where the operator lists its plugins."""


class PluginError(ValueError):
    """A plugin path is malformed, not registered, or could not be turned into its object."""


class PluginCrash(RuntimeError):
    """Plugin code raised something that is not an `Exception` (SystemExit, KeyboardInterrupt...)."""


_lock = threading.Lock()
_registered: dict[tuple[str, str], Any] = {}
_problems: dict[tuple[str, str], str] = {}
_from_environ_done = False


def lookup(path: str, *, kind: str) -> Any:
    """The registered (and guarded) object at `path`. Never imports: an unregistered path is a
    PluginError that says how the operator registers it."""
    if not isinstance(path, str) or not DOTTED.match(path):
        raise PluginError(f"{kind} {path!r} is not a plugin path like mypkg.module:name")
    register_from_environ()
    obj = _registered.get((kind, path))
    if obj is None:
        problem = _problems.get((kind, path))
        if problem:
            raise PluginError(f"{kind} {path!r} is registered but failed to load when the process started: {problem}")
        raise PluginError(
            f"{kind} {path!r} is not a registered plugin; the operator lists the plugins a config may name "
            f"in {ENV_VARS[kind]} (comma-separated package.module:name paths)"
        )
    return obj


def registered(kind: str) -> dict[str, Any]:
    """Path -> object for every plugin of this kind that loaded, in registration order."""
    register_from_environ()
    return {path: obj for (k, path), obj in _registered.items() if k == kind}


def problems() -> dict[str, str]:
    """`kind path` -> why it did not load, for every listed plugin that failed (shown to the operator)."""
    register_from_environ()
    return {f"{kind} {path}": text for (kind, path), text in _problems.items()}


def register(path: str, *, kind: str) -> Any:
    """Import `path` now and make it available to `lookup`. For the operator's code only: the
    process start-up (`register_from_environ`), the command line and tests call it, never a request."""
    if kind not in ENV_VARS:
        raise ValueError(f"unknown plugin kind {kind!r}")
    obj = guard(_import(path, kind=kind), what=f"{kind} {path}")
    with _lock:
        _registered[(kind, path)] = obj
        _problems.pop((kind, path), None)
    return obj


def register_for_children(path: str, *, kind: str) -> Any:
    """`register`, and add `path` to the environment variable so that the processes this one
    starts (torchrun ranks) register it too."""
    obj = register(path, kind=kind)
    var = ENV_VARS[kind]
    listed = [p.strip() for p in os.environ.get(var, "").split(",") if p.strip()]
    if path not in listed:
        os.environ[var] = ",".join([*listed, path])
    return obj


def register_named_in(environment: str, reward_fns: Sequence[str] = (), tools: Sequence[str] = ()) -> None:
    """Register the plugins a config names (built-in names are skipped). For the command line,
    whose user is the operator of their own machine; never for a config someone else sent."""
    if ":" in environment:
        register_for_children(environment, kind=ENVIRONMENT)
    for reward_fn in reward_fns:
        if not reward_fn.startswith("agents.verifiers:"):
            register_for_children(reward_fn, kind=REWARD_FUNCTION)
    for tool in tools:
        if ":" in tool:
            register_for_children(tool, kind=TOOL)


def unregister(path: str, *, kind: str) -> None:
    with _lock:
        _registered.pop((kind, path), None)
        _problems.pop((kind, path), None)


def register_from_environ() -> None:
    """Register the plugins listed in TROUPE_ENVIRONMENTS, TROUPE_REWARD_FUNCTIONS and TROUPE_TOOLS, once per
    process. One that fails is logged and remembered (`problems`), never fatal."""
    global _from_environ_done
    if _from_environ_done:
        return
    with _lock:
        if _from_environ_done:
            return
        _from_environ_done = True
    for kind, var in ENV_VARS.items():
        for path in (p.strip() for p in os.environ.get(var, "").split(",")):
            if not path:
                continue
            try:
                register(path, kind=kind)
            except PluginError as exc:
                with _lock:
                    _problems[(kind, path)] = str(exc)
                log.warning("%s: %s is left out: %s", var, path, exc)


def guard(obj: Any, *, what: str) -> Any:
    """`obj` with every call into it turned safe: a class or function is wrapped so that calling it
    converts a non-Exception escape into PluginCrash, and an instance it makes is wrapped too, so
    its methods are guarded as well."""
    if isinstance(obj, type) or callable(obj):
        return _GuardedFactory(obj, what)
    return obj


def _crash(exc: BaseException, what: str) -> PluginCrash:
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" at {frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name}" if len(frames) > 1 else ""
    return PluginCrash(f"{what} raised {type(exc).__name__}: {exc}{where}")


def _call(fn: Any, what: str, *args: Any, **kwargs: Any) -> Any:
    try:
        return fn(*args, **kwargs)
    except Exception:
        raise
    except (SystemExit, KeyboardInterrupt, GeneratorExit) as exc:
        raise _crash(exc, what) from exc


class _GuardedFactory:
    """A plugin class or function: calling it is guarded, and what a class returns is a _GuardedObject."""

    def __init__(self, target: Any, what: str):
        self.__wrapped__ = target
        self._what = what
        functools.update_wrapper(self, target, updated=())

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        result = _call(self.__wrapped__, self._what, *args, **kwargs)
        return _GuardedObject(result, self._what) if isinstance(self.__wrapped__, type) else result

    def __getattr__(self, name: str) -> Any:
        return _call(getattr, self._what, self.__wrapped__, name)

    def __reduce__(self) -> tuple[Any, ...]:  # pickled as what it guards (an async run's sampler process gets it)
        return (_GuardedFactory, (self.__wrapped__, self._what))


class _GuardedObject:
    """An instance of a plugin class: attribute reads and method calls are guarded."""

    def __init__(self, target: Any, what: str):
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_what", what)

    def __getattr__(self, name: str) -> Any:
        target, what = self._target, self._what
        value = _call(getattr, what, target, name)
        if callable(value) and not isinstance(value, type):
            return functools.partial(_call, value, f"{what}.{name}")
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._target, name, value)

    def __repr__(self) -> str:
        return repr(self._target)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_GuardedObject, (self._target, self._what))


def _import(path: str, *, kind: str) -> Any:
    """Import `package.module:attribute`, with errors that say which part of the path is wrong."""
    if not isinstance(path, str) or not DOTTED.match(path):
        raise PluginError(f"{kind} {path!r} is not a plugin path like mypkg.module:name")
    module_name, _, attr_path = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or module_name
        if module_name == missing or module_name.startswith(missing + "."):
            raise PluginError(f"{kind} {path!r}: no module named {missing!r} (is it installed or on PYTHONPATH?)") from exc
        raise PluginError(f"{kind} {path!r}: importing {module_name!r} failed: {exc}") from exc
    except BaseException as exc:  # noqa: BLE001 (SystemExit at import time must not end the process)
        raise PluginError(f"{kind} {path!r}: importing {module_name!r} failed: {type(exc).__name__}: {exc}") from exc
    obj: Any = module
    for part in attr_path.split("."):
        if not hasattr(obj, part):
            public = sorted(n for n in dir(module) if not n.startswith("_"))
            hint = f"; it defines: {', '.join(public[:20])}" if public else ""
            raise PluginError(f"{kind} {path!r}: module {module_name!r} has no attribute {attr_path!r}{hint}")
        obj = getattr(obj, part)
    return obj
