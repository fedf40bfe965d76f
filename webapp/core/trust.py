"""The trust boundary: what a team member, or a script holding their API token, may submit.

Every way in calls this module before anything is stored or run: the run form and its advanced
YAML and live preview, the API, the model, agent and topology forms (through the models'
`clean`, so the admin too), and the worker once more before it trains. What it decides:

- size: text and bodies (`MAX_CONFIG_BYTES`), YAML without aliases (an alias bomb of a few
  hundred bytes expands to megabytes), nesting depth, strings, lists and mappings, and the number
  of values in a tree (`check_tree`);
- code: a config names only built-in environments and reward functions or plugins the operator
  registered at process start (`agents.plugins`); nothing is imported on a request;
- destinations: a run's metrics go only to tracker destinations the operator lists
  (`TROUPE_TRACKER_DESTINATIONS`), since the worker's credentials send them;
- files: a model source is a bundled model, a tiny random model, a well-formed hub id, or a
  folder under an operator model root (`TROUPE_MODEL_ROOTS`) or in the team's own runs and
  exports; never another team's data and never the data dir's internals. A dataset file and a
  checkpoint to resume from must be the team's own.

Dataset rows are checked by `training.data.read_rows` against the environment's declared row
fields (the upload form and the engine share that reader). Every refusal is a
`training.config.ConfigError` naming the field and the limit, which the forms show next to the
field and the API returns as a 400. docs/security.md gives the threat model.
"""

from __future__ import annotations

import copy
import json
import math
import unicodedata
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

import yaml
from django.conf import settings

from agents.base import missing_members
from agents.envs import KNOWN, load_environment
from agents.plugins import ENVIRONMENT, REWARD_FUNCTION, PluginError, lookup
from agents.verifiers import BUILTIN_REWARDS
from training.config import ConfigError, RunConfig, raise_problems, related_fields, tracker_destinations
from training.config import check_model_source as engine_check_model_source
from training.text import NOT_STORABLE, storable_problem  # noqa: F401 - the one check, named here as the web uses it
from webapp.core.console import UNPRINTABLE, printable

MAX_CONFIG_BYTES = 64 * 1024
"""The largest config text (advanced YAML, an API body's config) accepted."""


MAX_DEPTH = 12
"""How deeply mappings and lists may nest in a config (a full config needs 5)."""


MAX_VALUES = 4_000
"""Values (scalars, mappings and lists) in one config tree."""


MAX_STRING = 20_000
"""Characters in one string (an agent's instructions are the longest legitimate ones)."""


MAX_ITEMS = 512
"""Entries in one list or mapping."""


MAX_ENV_ARGS_DEPTH = 4
"""How deeply an environment's arguments may nest."""


MAX_ENV_ARGS_BYTES = 16 * 1024
"""The largest `env_args` mapping, as JSON."""


BIDI_CONTROLS = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
"""Characters that reorder the text around them (a name that reads `exe.txt` but is `txt.exe`)."""


# == size ============================================================================================


class _NoAliasLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing aliases (`*name`) and bounding depth and scalar size while it
    composes, before anything is expanded or constructed."""

    field = "yaml"

    def __init__(self, stream: str):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise ConfigError(self.field, f"YAML aliases (*{event.anchor}) are not accepted (line {event.start_mark.line + 1}); write the value out")
        event = self.peek_event()
        if isinstance(event, yaml.ScalarEvent) and len(event.value) > MAX_STRING:
            raise ConfigError(self.field, f"a value on line {event.start_mark.line + 1} is {len(event.value):,} characters; the limit is {MAX_STRING:,}")
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise ConfigError(self.field, f"nested more than {MAX_DEPTH} levels deep (line {event.start_mark.line + 1})")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def yaml_load(text: str, *, field: str = "yaml") -> Any:
    """Parse untrusted YAML: at most MAX_CONFIG_BYTES, no aliases, bounded depth and size.
    Raises ConfigError(field) with the problem and its line, never PyYAML's multi-line message."""
    if not isinstance(text, str):
        raise ConfigError(field, "must be YAML text")
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_CONFIG_BYTES:
        raise ConfigError(field, f"is {size:,} bytes; the limit is {MAX_CONFIG_BYTES:,}")
    loader = None
    try:
        loader = _NoAliasLoader(text)  # the reader refuses non-printable characters already here
        loader.field = field
        tree = loader.get_single_data()
    except ConfigError:
        raise
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise ConfigError(field, f"not valid YAML: {exc.problem or exc.context}{where}") from None
    except (yaml.YAMLError, ValueError, OverflowError, RecursionError) as exc:
        raise ConfigError(field, f"not valid YAML: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
    finally:
        if loader is not None:
            loader.dispose()
    check_tree(tree, field=field)
    return tree


def json_load(body: bytes | str, *, field: str = "body") -> Any:
    """Parse an untrusted JSON body with the same bounds as `yaml_load`; a key given twice in one
    object and the non-standard NaN/Infinity are refused (Python's parser accepts both silently)."""
    if len(body) > MAX_CONFIG_BYTES * 2:
        raise ConfigError(field, f"is {len(body):,} bytes; the limit is {MAX_CONFIG_BYTES * 2:,}")

    def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                raise ConfigError(field, f"the key {key[:60]!r} appears twice in one object")
            out[key] = value
        return out

    def no_constant(name: str) -> Any:
        raise ConfigError(field, f"{name} is not a JSON number; send a finite number")

    try:
        tree = json.loads(body or b"{}", object_pairs_hook=unique_keys, parse_constant=no_constant)
    except ConfigError:
        raise
    except RecursionError:
        raise ConfigError(field, f"nested more than {MAX_DEPTH} levels deep") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(field, f"not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})") from None
    except (ValueError, UnicodeDecodeError) as exc:  # a huge integer, bad UTF-8
        raise ConfigError(field, f"not valid JSON: {str(exc).splitlines()[0]}") from None
    check_tree(tree, field=field)
    return tree


def check_tree(tree: Any, *, field: str, max_depth: int = MAX_DEPTH) -> None:
    """Refuse a parsed tree that nests deeper than `max_depth`, holds more than MAX_VALUES values,
    a string over MAX_STRING characters, a list or mapping over MAX_ITEMS entries, or a value that
    is not plain data (str, int, float, bool, None, list, mapping with string keys), a NUL character
    or a lone surrogate in a string or key (no database stores them: `NOT_STORABLE`), or a number
    that is not finite (NaN, infinity)."""
    count = 0
    stack: list[tuple[Any, str, int]] = [(tree, field, 1)]
    while stack:
        node, where, depth = stack.pop()
        count += 1
        if count > MAX_VALUES:
            raise ConfigError(field, f"holds more than {MAX_VALUES:,} values")
        if depth > max_depth:
            raise ConfigError(where, f"nested more than {max_depth} levels deep")
        if isinstance(node, str):
            if len(node) > MAX_STRING:
                raise ConfigError(where, f"is {len(node):,} characters; the limit is {MAX_STRING:,}")
            problem = storable_problem(node)
            if problem:
                raise ConfigError(where, problem)
        elif isinstance(node, float) and not math.isfinite(node):
            raise ConfigError(where, f"must be a finite number, not {node}")
        elif isinstance(node, dict):
            if len(node) > MAX_ITEMS:
                raise ConfigError(where, f"has {len(node):,} entries; the limit is {MAX_ITEMS}")
            for key, value in node.items():
                if not isinstance(key, str):
                    raise ConfigError(where, f"keys must be text, not {type(key).__name__} ({str(key)[:40]!r})")
                if len(key) > 200:
                    raise ConfigError(where, f"has a key of {len(key):,} characters; the limit is 200")
                problem = storable_problem(key)
                if problem:
                    raise ConfigError(where, f"has a key that {problem}")
                if any(unicodedata.category(ch) in UNPRINTABLE for ch in key):
                    # A key is a field or an agent's name, never free text; an error names it (and a log may print it).
                    raise ConfigError(where, f"has a key with a control or invisible character: '{printable(key, limit=60)}'")
                stack.append((value, f"{where}.{key}", depth + 1))
        elif isinstance(node, list):
            if len(node) > MAX_ITEMS:
                raise ConfigError(where, f"has {len(node):,} items; the limit is {MAX_ITEMS}")
            stack.extend((value, f"{where}[{i}]", depth + 1) for i, value in enumerate(node))
        elif node is not None and not isinstance(node, (bool, int, float)):
            raise ConfigError(where, f"must be plain data (text, a number, true/false, a list or a mapping), not {type(node).__name__}")


def check_name(name: Any, *, field: str = "name") -> None:
    """A name people read (a run, model, agent, topology, dataset, token): no control characters
    (NUL included), no bidirectional or other invisible format characters, no lone surrogates."""
    if not isinstance(name, str):
        raise ConfigError(field, "must be text")
    for ch in name:
        if ch in BIDI_CONTROLS:
            raise ConfigError(field, f"contains the bidirectional control character U+{ord(ch):04X}, which reorders the text shown around it")
        if unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"):
            kind = "a NUL character" if ch == "\x00" else f"the invisible or control character U+{ord(ch):04X}"
            raise ConfigError(field, f"contains {kind}")


MAX_TASK_ARGS_DEPTH = 10
"""How deeply a `task`'s arguments may nest: its definition holds graders, a JSON Schema grader's
schema nests inside (a config as a whole may nest MAX_DEPTH, of which env_args starts at 3)."""


MAX_TASK_ARGS_BYTES = 48 * 1024
"""The largest `task` arguments (its definition, Python graders' code included), as JSON."""


def check_env_args(env_args: Any, *, field: str = "env_args", environment: str | None = None) -> None:
    """An environment's arguments: a small mapping of plain data (for `task`, a team's task defined
    as data, a larger and deeper one: `MAX_TASK_ARGS_DEPTH`, `MAX_TASK_ARGS_BYTES`)."""
    if not isinstance(env_args, dict):
        raise ConfigError(field, "must be a mapping of argument names to values, like {\"level\": 2}")
    task = environment == "task"
    check_tree(env_args, field=field, max_depth=MAX_TASK_ARGS_DEPTH if task else MAX_ENV_ARGS_DEPTH)
    size, limit = len(json.dumps(env_args)), MAX_TASK_ARGS_BYTES if task else MAX_ENV_ARGS_BYTES
    if size > limit:
        raise ConfigError(field, f"is {size:,} bytes as JSON; the limit is {limit:,}")


# == code ============================================================================================


def check_environment(name: str, *, field: str) -> None:
    """A built-in environment or a registered plugin environment: nothing is imported here."""
    if name in KNOWN:
        return
    try:
        env = lookup(name, kind=ENVIRONMENT)
    except PluginError as exc:
        raise ConfigError(field, f"{exc}; built-ins are {', '.join(KNOWN)}") from None
    if missing_members(env):
        raise ConfigError(field, f"{name!r} is not an environment class (see agents.base.Environment)")


def check_plugins(config: RunConfig) -> None:
    """The environment and reward functions must be built-in or registered by the operator:
    nothing is imported here (registered plugins loaded at process start)."""
    check_environment(config.topology.environment, field="topology.environment")
    for field, reward_fn in _reward_functions(config):
        check_reward_function(reward_fn, field=field)


def check_reward_function(path: str, *, field: str) -> None:
    """A built-in reward function or a registered plugin one: nothing is imported here."""
    if path not in BUILTIN_REWARDS:
        try:
            lookup(path, kind=REWARD_FUNCTION)
        except PluginError as exc:
            raise ConfigError(field, f"{exc}; built-ins are {', '.join(BUILTIN_REWARDS)}") from None


def _reward_functions(config: RunConfig) -> list[tuple[str, str]]:
    """(field, dotted path) of each reward function the config names."""
    return ([("data.reward_fn", config.data.reward_fn)] if config.data.reward_fn else []) + \
        [(f"data.reward_fns[{i}]", path) for i, path in enumerate(config.data.reward_fns)]


# == where a run's data goes ==========================================================================

TRACKER_DESTINATIONS = tracker_destinations()
"""`report_to` fields that send a run's data somewhere with the worker's credentials -> the tracker
(`training.config.TRACKERS`) whose name prefixes the allowed values the operator lists in
TROUPE_TRACKER_DESTINATIONS (`mlflow:https://host`). Declared once, on each field of
`training.config.ReportToConfig` (its `destination` metadata); every other field stays with the run."""


def check_report_to(config: RunConfig) -> None:
    """A team chooses which trackers get its metrics, the project and the run name; where the data
    goes with the worker's credentials (an MLflow server, a Trackio Space, a W&B entity) is the
    operator's choice: a value not listed in TROUPE_TRACKER_DESTINATIONS is refused. (Left empty,
    each tracker uses the worker's own environment: MLFLOW_TRACKING_URI, WANDB_ENTITY...)"""
    allowed = set(settings.TROUPE_TRACKER_DESTINATIONS)
    raise_problems([
        ConfigError(f"report_to.{name}",
                    f"{value!r} is not a destination the operator allows; leave it empty to use the worker's own "
                    f"settings, or ask the operator to list {prefix}:{value} in TROUPE_TRACKER_DESTINATIONS")
        for name, prefix in TRACKER_DESTINATIONS.items()
        if (value := getattr(config.report_to, name)) and f"{prefix}:{value}" not in allowed
    ])


# == files ===========================================================================================


def model_roots() -> list[Path]:
    """Folders the operator lets teams name as `local:` model sources (TROUPE_MODEL_ROOTS)."""
    return [Path(p).resolve() for p in settings.TROUPE_MODEL_ROOTS]


class TeamFiles(Protocol):
    """What the boundary must know of a team's own files (`webapp.models.Team` provides it)."""

    def model_folders(self) -> list[Path]:
        """Folders of the team's runs and merged exports, resolved."""
        ...

    def dataset_files(self, *, conversations: bool = False) -> set[Path]:
        """The team's uploaded task dataset files (or its conversations files), resolved."""
        ...

    def checkpoint_step(self, path: str) -> int | None:
        """The step of `path` if it is a kept checkpoint of one of the team's finished runs, else None."""
        ...


def check_model_source(*, team: TeamFiles, source: str, field: str, look_inside: bool = True) -> None:
    """A model source a team may use (see the module docstring). The folder is resolved (links
    followed) and checked against the allowed places before anything inside it is looked at, so
    a refusal says nothing about what exists elsewhere."""
    if not isinstance(source, str) or len(source) > 500:
        raise ConfigError(field, "a model source is text of at most 500 characters")
    if source.startswith(("local:", "/", ".", "~")):
        raw = source.removeprefix("local:")
        if not raw.startswith("/"):
            raise ConfigError(field, f"{source!r}: a local model folder must be an absolute path")
        if "\x00" in raw:
            raise ConfigError(field, "a model folder path cannot contain NUL characters")
        folder = Path(raw).resolve()
        allowed = model_roots() + team.model_folders()
        if not any(folder == root or folder.is_relative_to(root) for root in allowed):
            roots = ", ".join(str(r) for r in model_roots()) or "none configured"
            raise ConfigError(
                field,
                f"{raw!r} is outside the folders your team may use: the operator's model roots ({roots}) "
                "and your team's own runs and exports",
            )
    if look_inside:
        engine_check_model_source(field, source)


def config_from_tree(*, team: TeamFiles, tree: Any, problems: list[ConfigError] | None = None) -> RunConfig:
    """The RunConfig a team submitted as a parsed tree, checked from end to end in one pass: its
    size first (a tree too large stops here), the folders it names before the engine's own
    validation looks inside any of them (so the engine's "no config.json" cannot tell a team what
    exists elsewhere: a refused folder is left out of what the engine sees), then the engine's
    fields and everything `check_config` decides. Raises ConfigError, or ConfigProblems naming
    every problem when there are several; `problems` found earlier by the caller (a bad YAML
    text, a dataset for another environment) are raised with them."""
    check_tree(tree, field="config")
    found = list(problems or [])
    trial = tree
    if isinstance(tree, dict):
        trial = copy.deepcopy(tree)
        model = trial.get("model")
        if isinstance(model, dict) and isinstance(model.get("source"), str):
            try:
                check_model_source(team=team, source=model["source"], field="model.source", look_inside=False)
            except ConfigError as exc:
                found.append(exc)
                del model["source"]
        topology = trial.get("topology")
        agents = topology.get("agents") if isinstance(topology, dict) else None
        for i, agent in enumerate(agents if isinstance(agents, list) else []):
            if isinstance(agent, dict) and isinstance(agent.get("model"), str):
                try:
                    check_model_source(team=team, source=agent["model"], field=f"topology.agents[{i}].model", look_inside=False)
                except ConfigError as exc:
                    found.append(exc)
                    del agent["model"]
    config, engine = RunConfig.build(trial)
    found += engine
    found += config_problems(team=team, config=config, skip=[p.field for p in found])
    raise_problems(found)
    return config


def check_config(*, team: TeamFiles, config: RunConfig) -> None:
    """Everything a run config may reach (`config_problems`). Raises ConfigError naming the field,
    or ConfigProblems naming each when there are several."""
    raise_problems(config_problems(team=team, config=config))


def config_problems(*, team: TeamFiles, config: RunConfig, skip: list[str] | None = None) -> list[ConfigError]:
    """Every problem with what a run config may reach, for a config from any way in:

    - its size (`check_tree` on the whole tree, `check_env_args` on the environment's arguments)
      and its name (`check_name`);
    - plugins built in or registered (`check_plugins`), and the environment's own checks of its
      arguments (only for an environment that passed, so nothing unregistered is ever loaded);
    - tracker destinations the operator allows (`check_report_to`);
    - model sources the team may use (`check_model_source`);
    - `data.path` one of the team's uploaded task datasets, `sft.path` one of its conversations
      datasets; `checkpoint.resume_from` and `model.init_from.run` (a warm start) a kept checkpoint
      of one of the team's finished runs, with a folder for each policy and an agent mapping of this
      run's policies only (`_init_from_problems`);
    - `resources.hosts > 1` only where the operator named a Ray cluster (TROUPE_RAY_ADDRESS).

    Fields in `skip` (and fields inside them) already have a problem, found by the caller: they
    are not checked again."""
    skipped = list(skip or [])
    found: list[ConfigError] = []

    def at_fault(*fields: str) -> bool:
        return any(related_fields(f, s) for f in fields for s in skipped + [p.field for p in found])

    @contextmanager
    def check(*fields: str) -> Iterator[None]:  # a check that raises; nothing recorded for a field at fault already
        enabled = not at_fault(*fields)
        try:
            yield
        except ConfigError as exc:
            if enabled:
                found.extend(exc.problems)

    with check("config"):
        check_tree(config.to_dict(), field="config")
    with check("name"):
        check_name(config.name, field="name")
    with check("topology.env_args"):
        check_env_args(config.topology.env_args, field="topology.env_args", environment=config.topology.environment)
    with check("topology.environment"):
        check_environment(config.topology.environment, field="topology.environment")
    for field, reward_fn in _reward_functions(config):
        with check(field):
            check_reward_function(reward_fn, field=field)
    with check("report_to"):
        check_report_to(config)
    if not at_fault("topology.environment", "topology.env_args"):
        try:  # the environment's own checks on its arguments (e.g. a sandbox timeout of at most 30 s)
            load_environment(config.topology.environment, **config.topology.env_args)
        except Exception as exc:  # noqa: BLE001 (plugin constructors raise what they like; PluginCrash included)
            found.append(ConfigError("topology.env_args", f"{config.topology.environment} refused these arguments: {exc}"))
    for where, source in [("model.source", config.model.source)] + [
        (f"topology.agents[{i}].model", a.model) for i, a in enumerate(config.topology.agents) if a.model
    ]:
        with check(where):
            check_model_source(team=team, source=source, field=where)
    if config.data.path is not None and not at_fault("data.path"):
        if Path(config.data.path).resolve() not in team.dataset_files():
            found.append(ConfigError("data.path", "must be one of your team's uploaded task datasets; pass its id as `dataset` instead "
                                                  "of a path"))
    if config.resources.hosts > 1 and not settings.TROUPE_RAY_ADDRESS and not at_fault("resources.hosts"):
        found.append(ConfigError("resources.hosts", f"the run asks for {config.resources.hosts} hosts, and this installation names no "
                                                    "Ray cluster (the operator sets TROUPE_RAY_ADDRESS on the web and the worker); "
                                                    "use resources.hosts: 1"))
    if config.checkpoint.resume_from is not None and not at_fault("checkpoint.resume_from"):
        if team.checkpoint_step(config.checkpoint.resume_from) is None:
            found.append(ConfigError("checkpoint.resume_from", "must be the path of a kept checkpoint of one of your team's finished runs"))
    if config.sft.path is not None and not at_fault("sft.path"):
        if Path(config.sft.path).resolve() not in team.dataset_files(conversations=True):
            found.append(ConfigError("sft.path", "must be one of your team's uploaded conversations datasets (a task dataset holds no "
                                                 "conversations to learn from)"))
    if not at_fault("model.init_from"):
        found += _init_from_problems(team=team, config=config)
    return found


def policy_names(config: RunConfig) -> list[str]:
    """The policies a run of `config` trains or acts with, as the engine names them
    (`training.policies.build_policies`): `shared` for `single` and `prompt`, else one per acting agent."""
    if config.topology.specialization in ("single", "prompt"):
        return ["shared"]
    return list(dict.fromkeys(config.topology.order()))


def _init_from_problems(*, team: TeamFiles, config: RunConfig) -> list[ConfigError]:
    """A warm start (`model.init_from`) a run can begin with: a kept checkpoint of one of the team's
    finished runs, at the step asked, whose folders hold one for each of this run's policies; its
    agent mapping maps only this run's policies. Everything the engine would refuse when the run
    starts is refused at launch instead."""
    init = config.model.init_from
    found: list[ConfigError] = []
    policies = policy_names(config)
    for mine in init.agents:
        if mine not in policies:
            found.append(ConfigError("model.init_from.agents", f"this run has no policy '{printable(mine, limit=60)}'; its policies: "
                                                               f"{', '.join(policies)}"))
    if not init.run:
        return found
    step = team.checkpoint_step(init.run)
    if step is None:
        found.append(ConfigError("model.init_from.run", "must be the path of a kept checkpoint of one of your team's finished runs "
                                                        "(the run form's \"Start from the weights of\" fills it in)"))
        return found
    if init.step and init.step != step:
        found.append(ConfigError("model.init_from.step", f"the checkpoint at model.init_from.run is step {step}, not {init.step}"))
    folder = Path(init.run)
    if not found and folder.is_dir():  # (a folder missing on this host is the worker's to find: the data dir may be its own)
        have = sorted(p.name for p in folder.iterdir() if p.is_dir())
        for name in policies:
            theirs = init.agents.get(name, name)
            if theirs not in have:
                where = "model.init_from.agents" if name in init.agents else "model.init_from.run"
                found.append(ConfigError(where, f"the checkpoint has no folder '{printable(theirs, limit=60)}' for policy {name!r} (it has: "
                                                f"{', '.join(have) or 'none'}); map it in model.init_from.agents"))
    return found
