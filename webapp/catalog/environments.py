"""The environments the catalog is built for (`agents.envs` and the operator's registered plugins),
as the forms, pages and services ask for them."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from django.core.exceptions import ValidationError

from agents import plugins
from agents.base import Environment
from agents.envs import DEFINED, EnvironmentInfo, describe_environment, list_environments, load_environment

log = logging.getLogger(__name__)


def environment_infos() -> dict[str, EnvironmentInfo]:
    """The environments the forms offer (name, summary, roles, required fields, arguments): the
    built-ins, then the plugins the operator registered (`agents.plugins`, named by their dotted
    path). A registered plugin whose class cannot even be described is logged and left out."""
    infos = {info.name: info for info in list_environments()}
    infos.update({name: describe_environment(name, cls) for name, cls in DEFINED.items()})  # `task`: its roles come from each task
    for path, cls in plugins.registered(plugins.ENVIRONMENT).items():
        try:
            infos[path] = describe_environment(path, cls)
        except Exception as exc:  # noqa: BLE001 (an operator's broken plugin must not take every form down)
            log.warning("environment plugin %s is left out: %s", path, exc)
    return infos


def environment_names() -> list[str]:
    return list(environment_infos())


def environment_load(*, name: str, env_args: Mapping[str, Any] | None = None, args_field: str = "env_args") -> Environment:
    """The environment, or a ValidationError on `environment` (unknown) or `args_field` (bad args)."""
    if name not in environment_names():
        raise ValidationError({"environment": f"Unknown environment {name!r}."})
    try:
        return load_environment(name, **dict(env_args or {}))
    except Exception as exc:  # an environment's own argument checks raise what they like
        raise ValidationError({args_field: f"{name} rejected these arguments: {exc}"}) from None


def environment_describe(*, name: str) -> EnvironmentInfo | None:
    """What pages show about an environment; None when there is no such built-in."""
    return environment_infos().get(name)


def environment_roles() -> dict[str, tuple[str, ...]]:
    """Environment name -> the roles agents can play there."""
    return {name: info.roles for name, info in environment_infos().items()}
