"""Experiments: a base RunConfig, a grid of axes over its fields, and a list of seeds.

An experiment expands into ordinary runs ("trials"): one per grid point ("arm") and seed. The
seed goes into the run's own `seed` field, so it changes the data order, the sampling and the
held-out tasks' draw exactly as a run's seed does. Each trial is read back by its last greedy
held-out evaluation, and each arm is summarised over its seeds as a mean with a 95 % Student-t
interval.

A spec is checked as a whole before anything runs, and *every* problem comes back at once, each
naming its place (`axes.optim.lr`, `seeds[2]`): an unknown field (resolved against RunConfig's own
dataclass schema), a value the field refuses (the run's own validation decides), an empty list,
or more trials than `MAX_TRIALS`.

    name: lr-by-specialization
    base: tiny-lora.yaml          # a run config file (relative to this file) or an inline mapping
    axes:
      optim.lr: [3.0e-4, 1.0e-3]
      topology.specialization: [prompt, lora]
    seeds: [0, 1, 2]
    metric: team.success          # what ranks the arms: team.success or <agent>.success / .reward,
                                  # each also as sampled.<name> when the base sets eval.sampled
    direction: maximize
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from training.config import ConfigError, RunConfig
from training.search import SearchSpec, parse_search
from training.trials import NOT_AXES, SAMPLED, field_value, resolve_field, trial_metrics, with_fields

__all__ = ["NOT_AXES", "field_value", "resolve_field", "trial_metrics", "with_fields"]  # re-exported: the trial helpers live in training.trials

MAX_TRIALS = 256
"""Most runs one experiment may start (grid points x seeds): a typo like a 100-value axis should be
refused, not queue thousands of runs."""
MAX_AXIS_VALUES = 64
"""Most values one axis may list."""
MAX_SEEDS = 32
"""Most seeds one experiment may list."""
MAX_AXES = 16
"""Most fields one grid varies."""
MAX_PROBLEMS = 50
"""Most problems reported for one spec (the rest are counted)."""
DIRECTIONS = ("maximize", "minimize")
SPEC_KEYS = ("name", "base", "axes", "seeds", "metric", "direction", "search", "ablations")
_NAME = re.compile(r"^[\w.+-][\w .+-]{0,99}$")


class ExperimentError(ValueError):
    """A spec with problems: `problems` holds every one, each a ConfigError naming its place."""

    def __init__(self, problems: list[ConfigError]):
        self.problems = problems
        super().__init__("; ".join(str(p) for p in problems))


@dataclass(frozen=True)
class Axis:
    field: str
    """A dotted RunConfig field (`optim.lr`, `topology.agents[0].temperature`, `topology.env_args.level`)."""
    values: tuple[Any, ...]
    """The values the grid takes, as the run's config holds them after validation."""


@dataclass(frozen=True)
class Trial:
    """One run of an experiment: an arm (a grid point) at one seed."""

    index: int
    """Position in launch order: arms in grid order, every seed of an arm together."""
    arm: tuple[tuple[str, Any], ...]
    """(field, value) of each axis; empty when the experiment has no axes (seeds only)."""
    seed: int
    config: RunConfig


@dataclass(frozen=True)
class ExperimentSpec:
    name: str
    """The experiment's name; its trials are named `<name> [<arm>] seed <s>`."""
    base: RunConfig
    """The config every trial starts from."""
    axes: tuple[Axis, ...] = ()
    """The grid: every combination of the axes' values is one arm."""
    seeds: tuple[int, ...] = (0,)
    """Each arm runs once per seed (the run's `seed`)."""
    metric: str = "team.success"
    """What ranks the arms: `team.success`, or `<agent>.success` / `<agent>.reward`, read from each
    trial's last greedy held-out evaluation."""
    direction: str = "maximize"
    """Whether a higher (`maximize`) or a lower (`minimize`) metric is better."""
    search: SearchSpec | None = None
    """An Optuna search (`training.search`) instead of a grid: a budget of trials over ranges, each
    trial at the first seed, the pruner stopping trials that trail. None: the grid of `axes`."""
    ablations: tuple[str, ...] = ()
    """Ablations (`training.ablation` keys: `role_swap`, `untrained`, `alone:<agent>`, `apart`) that
    `python -m training sweep` evaluates on every finished trial that allows them, once all trials
    have run; `apart` teams a trial with the trial of the same seed that trained the agents it froze.
    Each trial's results go to its `ablations.json`, each arm's to the table under it."""

    # -- expansion ---------------------------------------------------------------------------

    def arms(self) -> list[tuple[tuple[str, Any], ...]]:
        """Every grid point, in order (the last axis varies fastest)."""
        return [tuple(zip([a.field for a in self.axes], values)) for values in itertools.product(*(a.values for a in self.axes))]

    def trials(self) -> list[Trial]:
        """The runs, arm by arm, every seed of an arm together (a search's trials are asked one by
        one instead: `training.search`)."""
        out: list[Trial] = []
        if self.search is not None:
            return out
        arms = self.arms()
        for arm in arms:
            for seed in self.seeds:
                config = with_fields(self.base, **dict(arm), seed=seed, name=trial_name(self.name, arm, seed, among=arms)[:200])
                out.append(Trial(index=len(out), arm=arm, seed=seed, config=config))
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "base": self.base.to_dict(),
            "axes": {a.field: list(a.values) for a in self.axes},
            "seeds": list(self.seeds),
            "metric": self.metric,
            "direction": self.direction,
            **({"search": self.search.to_dict()} if self.search is not None else {}),
            **({"ablations": list(self.ablations)} if self.ablations else {}),
        }

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False, allow_unicode=True, width=100)

    # -- loading -----------------------------------------------------------------------------

    @classmethod
    def from_dict(cls, data: Any, *, base_dir: Path | None = None, base: RunConfig | None = None) -> ExperimentSpec:
        """Build and check a spec; raise ExperimentError with every problem. `base` (already
        validated, e.g. built by the web app from a topology and dataset) stands in for the
        mapping's `base`; `base_dir` lets `base` name a YAML file relative to it (the CLI)."""
        problems = _Problems()
        if not isinstance(data, dict):
            raise ExperimentError([ConfigError("experiment", "must be a mapping with base, axes and seeds")])
        for key in sorted(set(data) - set(SPEC_KEYS), key=str):
            problems.add("experiment", f"unknown key {key!r}; allowed: {', '.join(SPEC_KEYS)}")
        name = data.get("name", base.name if base is not None else "experiment")
        if not isinstance(name, str) or not _NAME.match(name):
            problems.add("name", "must be 1-100 letters, digits, spaces, '.', '+', '-' or '_'")
            name = "experiment"
        if base is None:
            base = _load_base(data.get("base"), base_dir, problems)
        seeds = _check_seeds(data.get("seeds", [0]), problems)
        # The limits first, from the counts alone: checking each value builds a config (~10 ms), and
        # 58 axes of 64 values took 37 s of checks before the count refused them.
        raw_axes: dict[Any, Any] = data["axes"] if isinstance(data.get("axes"), dict) else {}
        n_points = math.prod([max(len(v), 1) if isinstance(v, list) else 1 for v in raw_axes.values()])
        too_many = n_points * max(len(seeds), 1) > MAX_TRIALS or len(raw_axes) > MAX_AXES
        if len(raw_axes) > MAX_AXES:
            problems.add("axes", f"has {len(raw_axes)} axes; an experiment varies at most {MAX_AXES} fields")
        elif too_many:
            problems.add("axes", f"{_count(n_points)} grid points x {len(seeds)} seeds = {_count(n_points * len(seeds))} runs; "
                                 f"an experiment starts at most {MAX_TRIALS}")
        axes = _check_axes(data.get("axes") or {}, base, problems) if base is not None and not too_many else ()
        metric = data.get("metric", "team.success")
        if base is not None:
            _check_metric(metric, base, problems)
            if base.eval.every <= 0 or base.eval.size <= 0:
                problems.add("base.eval.every", "trials are compared on held-out evaluations: set eval.every and eval.size above 0")
        direction = data.get("direction", "maximize")
        if direction not in DIRECTIONS:
            problems.add("direction", f"unknown value {direction!r}; allowed: {', '.join(DIRECTIONS)}")
        search = None
        if data.get("search") is not None and base is not None:
            if raw_axes:
                problems.add("search", "an experiment is a grid (axes) or a search, not both")
            search = parse_search(data["search"], base, problems.add)
        ablations = _check_ablations(data.get("ablations", []), search is not None or data.get("search") is not None, problems)
        if problems or base is None:
            raise ExperimentError(problems.items)
        spec = cls(name=name, base=base, axes=axes, seeds=seeds, metric=metric, direction=direction, search=search,
                   ablations=ablations)
        if axes and not problems:  # each value passed alone; now the combinations
            _check_combinations(spec, problems)
            if problems:
                raise ExperimentError(problems.items)
        return spec

    @classmethod
    def from_yaml(cls, text: str, *, base_dir: Path | None = None, base: RunConfig | None = None) -> ExperimentSpec:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ExperimentError([ConfigError("yaml", f"not valid YAML: {exc}")]) from None
        return cls.from_dict(data, base_dir=base_dir, base=base)

    @classmethod
    def load(cls, path: str | Path) -> ExperimentSpec:
        path = Path(path)
        return cls.from_yaml(path.read_text(encoding="utf-8"), base_dir=path.parent)


def _count(n: int) -> str:
    """A count for a message: in full while short (`3,712`), else its order of magnitude (64 values on
    58 axes are a 105-digit number of points)."""
    return f"{n:,}" if n < 10**15 else f"about 10^{len(str(n)) - 1}"


def trial_name(name: str, arm: tuple[tuple[str, Any], ...], seed: int, *, among: Sequence[tuple[tuple[str, Any], ...]] = ()) -> str:
    return f"{name} [{arm_label(arm, among)}] seed {seed}" if arm else f"{name} seed {seed}"


def arm_label(arm: tuple[tuple[str, Any], ...], among: Sequence[tuple[tuple[str, Any], ...]] = ()) -> str:
    """`optim.lr=0.001, topology.specialization=lora`; `base` for the experiment without axes. A
    value that is a mapping (an agent of a `topology.agents` axis) shows only its set fields: those
    left empty (None, '', [], {}) are its defaults and would bury what the arm changes. `among`: the
    experiment's arms; an agent then shows its name and only the fields in which the arms' agents at
    its place differ (`[{name: tool, trainable: true}, {name: reasoner, trainable: false}]`, not
    every instruction of both)."""
    return ", ".join(f"{f}={_show(_set_fields(_differing(f, v, among)))}" for f, v in arm) or "base"


def _differing(field: str, value: Any, among: Sequence[tuple[tuple[str, Any], ...]]) -> Any:
    """`value` (the arm's value of `field`) with each mapping, or each mapping of a list, reduced
    to `name` and the keys whose values differ across `among`'s values of `field` at its place;
    unchanged when the arms' values do not share its shape."""
    others: list[Any] = [dict(a).get(field) for a in among]
    if len(others) < 2:
        return value
    if isinstance(value, dict) and all(isinstance(o, dict) for o in others):
        return _reduced(value, others)
    if isinstance(value, (list, tuple)) and all(isinstance(o, (list, tuple)) and len(o) == len(value) for o in others):
        if all(isinstance(v, dict) for v in value) and all(isinstance(x, dict) for o in others for x in o):
            return [_reduced(v, [o[i] for o in others]) for i, v in enumerate(value)]
    return value


def _reduced(value: dict[str, Any], others: list[dict[str, Any]]) -> dict[str, Any]:
    keys = {k for o in others for k in o} | set(value)
    differ = {k for k in keys if len({repr(o.get(k)) for o in others}) > 1}
    return {k: v for k, v in value.items() if k == "name" or k in differ}


def _set_fields(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _set_fields(v) for k, v in value.items() if not (v is None or (isinstance(v, (str, list, tuple, dict)) and not v))}
    if isinstance(value, (list, tuple)):
        return [_set_fields(v) for v in value]
    return value


def _show(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple, dict)):
        return yaml.safe_dump(value, default_flow_style=True, width=10_000, sort_keys=False).strip()
    return str(value)


# -- checks ---------------------------------------------------------------------------------------


class _Problems:
    def __init__(self) -> None:
        self.items: list[ConfigError] = []

    def add(self, where: str, message: str) -> None:
        if len(self.items) < MAX_PROBLEMS:
            self.items.append(ConfigError(where, message))

    def __bool__(self) -> bool:
        return bool(self.items)


def _load_base(raw: Any, base_dir: Path | None, problems: _Problems) -> RunConfig | None:
    try:
        if isinstance(raw, str) and base_dir is not None:
            path = (base_dir / raw)
            if not path.is_file():
                problems.add("base", f"no such run config file {path}")
                return None
            return RunConfig.load(path)
        if isinstance(raw, dict):
            return RunConfig.from_dict(raw)
    except ConfigError as exc:
        problems.add(f"base.{exc.field}", exc.message)
        return None
    problems.add("base", "must be a run config: a mapping of sections" + (" or the path of a YAML file" if base_dir else ""))
    return None


def _check_seeds(raw: Any, problems: _Problems) -> tuple[int, ...]:
    if not isinstance(raw, list) or not raw:
        problems.add("seeds", "must be a non-empty list of integers, like [0, 1, 2]")
        return ()
    if len(raw) > MAX_SEEDS:
        problems.add("seeds", f"lists {len(raw)} seeds; at most {MAX_SEEDS}")
    seeds = []
    for i, s in enumerate(raw):
        if isinstance(s, bool) or not isinstance(s, int) or not 0 <= s <= 2**32 - 1:
            problems.add(f"seeds[{i}]", f"{s!r:.40} is not an integer between 0 and {2**32 - 1}")
        elif s in seeds:
            problems.add(f"seeds[{i}]", f"seed {s} is listed twice")
        else:
            seeds.append(s)
    return tuple(seeds)


def _check_ablations(raw: Any, search: bool, problems: _Problems) -> tuple[str, ...]:
    """The `ablations` list: known keys (`training.ablation.Ablation.parse`), each once, and a grid's."""
    from training.ablation import Ablation, AblationError

    if not isinstance(raw, list):
        problems.add("ablations", "must be a list, like [role_swap, apart]")
        return ()
    if raw and search:
        problems.add("ablations", "a search's trials are not ablated: ablate a grid's")
    keys: list[str] = []
    for i, key in enumerate(raw):
        try:
            parsed = Ablation.parse(key, paired=True) if isinstance(key, str) else None
        except AblationError as exc:
            problems.add(f"ablations[{i}]", str(exc))
            continue
        if parsed is None:
            problems.add(f"ablations[{i}]", f"{key!r:.40} is not an ablation's name")
        elif parsed.key in keys:
            problems.add(f"ablations[{i}]", f"{parsed.key} is listed twice")
        else:
            keys.append(parsed.key)
    return tuple(keys)


def _check_axes(raw: Any, base: RunConfig, problems: _Problems) -> tuple[Axis, ...]:
    if not isinstance(raw, dict):
        problems.add("axes", "must be a mapping of config field -> list of values, like {optim.lr: [1.0e-4, 3.0e-4]}")
        return ()
    axes = []
    for dotted, values in raw.items():
        where = f"axes.{dotted}"
        if not isinstance(dotted, str):
            problems.add("axes", f"{dotted!r} is not a dotted config field")
            continue
        try:
            resolve_field(base, dotted)
        except ConfigError as exc:
            problems.add(where, exc.message)
            continue
        if not isinstance(values, list) or not values:
            problems.add(where, "must be a non-empty list of values")
            continue
        if len(values) > MAX_AXIS_VALUES:
            problems.add(where, f"lists {len(values)} values; an axis takes at most {MAX_AXIS_VALUES}")
            continue
        resolved: list[Any] = []
        for i, value in enumerate(values):
            try:
                config = with_fields(base, **{dotted: value})
            except ConfigError as exc:
                detail = exc.message if exc.field == dotted else f"{exc.field}: {exc.message}"
                problems.add(where, f"value {_show(value)} (item {i + 1}) is refused: {detail}")
                continue
            got = field_value(config, dotted)
            if got in resolved:
                problems.add(where, f"value {_show(value)} (item {i + 1}) is listed twice")
            else:
                resolved.append(got)
        axes.append(Axis(dotted, tuple(resolved)))
    return tuple(axes)


def _check_combinations(spec: ExperimentSpec, problems: _Problems) -> None:
    """Every grid point must make a valid run (each value passed on its own already)."""
    bad = 0
    for arm in spec.arms():
        try:
            with_fields(spec.base, **dict(arm))
        except ConfigError as exc:
            bad += 1
            problems.add("axes", f"the arm {arm_label(arm)} is not a valid run: {exc}")
    if bad > MAX_PROBLEMS:
        problems.items[-1] = ConfigError("axes", f"{bad} arms in all are not valid runs")


def _check_metric(metric: Any, base: RunConfig, problems: _Problems) -> None:
    allowed = metric_names(base)
    if metric not in allowed:
        problems.add("metric", f"unknown metric {metric!r}; allowed: {', '.join(allowed)}")


def metric_names(config: RunConfig) -> list[str]:
    """The held-out metrics a trial of this config reports: the team's success, and each acting
    agent's success and mean local reward; the same again prefixed `sampled.` when the config
    evaluates at the training temperature too (`eval.sampled`)."""
    names = ["team.success"]
    for agent in dict.fromkeys(config.topology.order()):
        names += [f"{agent}.success", f"{agent}.reward"]
    return names + [SAMPLED + n for n in names] if config.eval.sampled else names


T_95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
        11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093, 20: 2.086,
        21: 2.080, 22: 2.074, 23: 2.069, 24: 2.064, 25: 2.060, 26: 2.056, 27: 2.052, 28: 2.048, 29: 2.045, 30: 2.042,
        40: 2.021, 60: 2.000, 120: 1.980}
"""Two-sided 95 % critical values of Student's t by degrees of freedom (standard tables); between
listed values the next smaller df is used (a slightly wider, conservative interval), past 120 the
normal's 1.960."""


def t_critical(df: int) -> float:
    if df < 1:
        raise ValueError("a t interval needs at least two values")
    if df > 120:
        return 1.960
    return T_95[max(k for k in T_95 if k <= df)]


@dataclass(frozen=True)
class Interval:
    mean: float
    half_width: float | None
    """Half the 95 % interval's width (None with a single value: no spread to estimate)."""
    n: int
    values: tuple[float, ...] = field(default=())

    @property
    def low(self) -> float | None:
        return None if self.half_width is None else self.mean - self.half_width

    @property
    def high(self) -> float | None:
        return None if self.half_width is None else self.mean + self.half_width

    def __str__(self) -> str:
        if self.half_width is None:
            return f"{self.mean:.3f}"
        return f"{self.mean:.3f} ± {self.half_width:.3f}"


def mean_interval(values: list[float]) -> Interval | None:
    """Mean and 95 % Student-t interval (mean ± t * s / sqrt(n)) of the values; None for none."""
    if not values:
        return None
    arr = np.asarray(values, dtype=float)  # (n,)
    mean = float(arr.mean())
    if len(arr) < 2:
        return Interval(mean, None, 1, tuple(values))
    sem = float(arr.std(ddof=1)) / math.sqrt(len(arr))
    return Interval(mean, t_critical(len(arr) - 1) * sem, len(arr), tuple(values))


@dataclass
class ArmSummary:
    arm: tuple[tuple[str, Any], ...]
    trials: list[tuple[int, dict[str, float]]]
    """(seed, metrics) of every finished trial of the arm."""
    metrics: dict[str, Interval]
    among: Sequence[tuple[tuple[str, Any], ...]] = ()
    """The experiment's arms (`arm_label`'s `among`)."""

    @property
    def label(self) -> str:
        return arm_label(self.arm, self.among)


def summarize(arms: list[tuple[tuple[str, Any], ...]], results: list[tuple[tuple[tuple[str, Any], ...], int, dict[str, float]]]) -> list[ArmSummary]:
    """One summary per arm (in the given order) from (arm, seed, metrics) of finished trials."""
    out = []
    for arm in arms:
        mine = [(seed, m) for a, seed, m in results if a == arm and m]
        names = list(dict.fromkeys(k for _, m in mine for k in m))
        metrics = {}
        for name in names:
            interval = mean_interval([m[name] for _, m in mine if name in m])
            if interval is not None:
                metrics[name] = interval
        out.append(ArmSummary(arm=arm, trials=mine, metrics=metrics, among=arms))
    return out


def best_arm(summaries: list[ArmSummary], metric: str, direction: str) -> ArmSummary | None:
    """The arm with the best mean of `metric`; None before any result, and None when two or more arms
    share the best mean exactly (no arm is best then)."""
    scored = [s for s in summaries if metric in s.metrics]
    if not scored:
        return None
    sign = 1.0 if direction == "maximize" else -1.0
    top = max(sign * s.metrics[metric].mean for s in scored)
    leaders = [s for s in scored if sign * s.metrics[metric].mean == top]
    return leaders[0] if len(leaders) == 1 else None
