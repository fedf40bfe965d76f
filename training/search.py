"""Hyperparameter search with Optuna: an experiment's `search` section instead of a grid.

    search:
      trials: 20                                        # the budget
      params:
        optim.lr: {low: 1.0e-5, high: 1.0e-3, log: true}  # log-uniform float
        grpo.k: {low: 2, high: 8}                       # integer (both bounds integers)
        topology.specialization: {choices: [prompt, lora]}
      pruner: median                                    # or none
      startup_trials: 5                                 # completed trials before the pruner may stop one

The study is driven ask-and-tell and lives in no store of its own: each time a trial is to start,
or the pruner asks about a running one, an in-memory Optuna study is rebuilt from the trials
recorded so far (the CLI's `trial.json` files, or the web app's Runs and their held-out
evaluations) and asked. So Troupe's own records are the study's storage, trials are ordinary runs
(pages, cancel, resume), and there is no second database to operate or migrate. The sampler is
Optuna's TPE, seeded with the experiment's first seed and the number of trials so far, so a search
resumed from the same records asks the same next point.

Every trial runs at the experiment's first seed. The target is the experiment's `metric` (a
held-out metric, the team's or one agent's) in its `direction`; Optuna's MedianPruner stops a trial
whose held-out evaluations (after step 0) trail the median of the completed trials at the same step.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from training.config import ConfigError, RunConfig
from training.events import EventSink, StepMetrics
from training.trials import field_value, resolve_field, trial_metrics, with_fields

if TYPE_CHECKING:
    import optuna

MAX_BUDGET = 256
MAX_PARAMS = 16
"""Most fields one search varies."""
MAX_VALUES = 256
"""Most range ends and choices one search lists in all (each is checked as a run's config would be)."""
PRUNERS = ("median", "none")
SEARCH_KEYS = ("trials", "params", "pruner", "startup_trials", "warmup_steps")
TRIAL_STATES = ("complete", "pruned", "failed", "running")


@dataclass(frozen=True)
class Param:
    field: str
    """A dotted RunConfig field."""
    kind: str
    """`float` (uniform, or log-uniform with `log`), `int`, or `choice`."""
    low: float | None = None
    high: float | None = None
    log: bool = False
    choices: tuple[Any, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        if self.kind == "choice":
            return {"choices": list(self.choices)}
        out: dict[str, Any] = {"low": self.low, "high": self.high}
        if self.log:
            out["log"] = True
        return out

    def distribution(self) -> Any:
        import optuna

        if self.kind == "choice":
            return optuna.distributions.CategoricalDistribution(list(self.choices))
        if self.kind == "int":
            return optuna.distributions.IntDistribution(int(self.low or 0), int(self.high or 0), log=self.log)
        return optuna.distributions.FloatDistribution(float(self.low or 0.0), float(self.high or 0.0), log=self.log)


@dataclass(frozen=True)
class SearchSpec:
    trials: int
    """The budget: trials the search starts in all."""
    params: tuple[Param, ...]
    pruner: str = "median"
    """`median`: Optuna's MedianPruner; `none`: every trial runs to its end."""
    startup_trials: int = 5
    """Completed trials before the pruner may stop one (MedianPruner's n_startup_trials)."""
    warmup_steps: int = 1
    """A trial is never stopped on an evaluation before this step (MedianPruner's n_warmup_steps)."""

    def to_dict(self) -> dict[str, Any]:
        return {"trials": self.trials, "params": {p.field: p.to_dict() for p in self.params}, "pruner": self.pruner,
                "startup_trials": self.startup_trials, "warmup_steps": self.warmup_steps}


def parse_search(raw: Any, base: RunConfig, add: Callable[[str, str], None]) -> SearchSpec | None:
    """The `search` section, every problem reported through `add(place, message)`."""
    if not isinstance(raw, dict):
        add("search", "must be a mapping with trials and params")
        return None
    for key in sorted(set(raw) - set(SEARCH_KEYS), key=str):
        add("search", f"unknown key {key!r}; allowed: {', '.join(SEARCH_KEYS)}")
    budget = raw.get("trials")
    if isinstance(budget, bool) or not isinstance(budget, int) or not 1 <= budget <= MAX_BUDGET:
        add("search.trials", f"must be a whole number of trials between 1 and {MAX_BUDGET}")
        budget = 1
    pruner = raw.get("pruner", "median")
    if pruner not in PRUNERS:
        add("search.pruner", f"unknown value {pruner!r}; allowed: {', '.join(PRUNERS)}")
    counts = {}
    for key, default in (("startup_trials", 5), ("warmup_steps", 1)):
        value = raw.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 1_000_000:
            add(f"search.{key}", "must be a whole number, 0 or more")
            value = default
        counts[key] = value
    params_raw = raw.get("params")
    if not isinstance(params_raw, dict) or not params_raw:
        add("search.params", "name at least one config field with its range, like {optim.lr: {low: 1.0e-5, high: 1.0e-3, log: true}}")
        return None
    # The limits first, from the counts alone: each end and choice is checked by building a config.
    if len(params_raw) > MAX_PARAMS:
        add("search.params", f"names {len(params_raw)} fields; a search varies at most {MAX_PARAMS}")
        return None
    values = sum(len(r["choices"]) if isinstance(r, dict) and isinstance(r.get("choices"), list) else 2 for r in params_raw.values())
    if values > MAX_VALUES:
        add("search.params", f"lists {values} ends and choices in all; a search takes at most {MAX_VALUES}")
        return None
    params = []
    for dotted, rng in params_raw.items():
        where = f"search.params.{dotted}"
        try:
            hint = resolve_field(base, str(dotted))
        except ConfigError as exc:
            add(where, exc.message)
            continue
        param = _parse_param(str(dotted), hint, rng, where, add)
        if param is None:
            continue
        ends = list(param.choices) if param.kind == "choice" else [param.low, param.high]
        ok = True
        for value in ends:
            try:
                checked = with_fields(base, **{param.field: value})
            except ConfigError as exc:
                add(where, f"value {value!r} is refused: {exc.message if exc.field == param.field else exc}")
                ok = False
                continue
            if param.kind == "choice" and field_value(checked, param.field) != value and not isinstance(value, (int, float)):
                add(where, f"value {value!r} is stored as {field_value(checked, param.field)!r}; give it that way")
                ok = False
        if ok:
            params.append(param)
    return SearchSpec(trials=budget, params=tuple(params), pruner=pruner, **counts)


def _parse_param(dotted: str, hint: Any, rng: Any, where: str, add: Callable[[str, str], None]) -> Param | None:
    if not isinstance(rng, dict):
        add(where, "must be {low, high} (with log: true for log-uniform) or {choices: [...]}")
        return None
    unknown = sorted(set(rng) - {"low", "high", "log", "choices"}, key=str)
    if unknown:
        add(where, f"unknown key {unknown[0]!r}; use low, high, log or choices")
        return None
    if "choices" in rng:
        choices = rng["choices"]
        if not isinstance(choices, list) or not choices or len(choices) > 64:
            add(where, "choices must be a list of 1 to 64 values")
            return None
        if any(not isinstance(c, (str, int, float, bool)) or c is None for c in choices) or len(set(map(repr, choices))) != len(choices):
            add(where, "choices must be distinct plain values (text, numbers, true/false)")
            return None
        return Param(dotted, "choice", choices=tuple(choices))
    low, high, log = rng.get("low"), rng.get("high"), rng.get("log", False)
    if not isinstance(log, bool):
        add(where, "log must be true or false")
        return None
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in (low, high))
    if not numbers:
        add(where, "low and high must be numbers")
        return None
    assert isinstance(low, (int, float)) and isinstance(high, (int, float))
    if not low < high:
        add(where, f"low ({low}) must be below high ({high})")
        return None
    if log and low <= 0:
        add(where, "a log-uniform range needs low above 0")
        return None
    if hint is int:
        if not (float(low).is_integer() and float(high).is_integer()):
            add(where, "is a whole-number field: low and high must be integers")
            return None
        return Param(dotted, "int", low=int(low), high=int(high), log=log)
    if hint is not float:
        add(where, "is not a number field: give {choices: [...]}")
        return None
    return Param(dotted, "float", low=float(low), high=float(high), log=log)


# -- the study, rebuilt from the records -----------------------------------------------------------


@dataclass
class TrialRecord:
    """One search trial as Troupe recorded it."""

    number: int
    params: dict[str, Any]
    state: str
    """`complete`, `pruned`, `failed` or `running`."""
    value: float | None = None
    """The target metric at the end (complete trials)."""
    intermediate: dict[int, float] = field(default_factory=dict)
    """Step -> the target metric at each held-out evaluation after step 0."""


def build_study(*, search: SearchSpec, direction: str, seed: int, records: list[TrialRecord]) -> optuna.Study:
    """An in-memory study holding the finished records (complete, pruned, failed) as its trials."""
    import optuna
    from optuna.study import StudyDirection

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    pruner: optuna.pruners.BasePruner = (
        optuna.pruners.MedianPruner(n_startup_trials=search.startup_trials, n_warmup_steps=search.warmup_steps)
        if search.pruner == "median" else optuna.pruners.NopPruner()
    )
    sampler = optuna.samplers.TPESampler(seed=(seed + 1_000_003 * len(records)) % 2**32)
    study = optuna.create_study(direction=StudyDirection.MAXIMIZE if direction == "maximize" else StudyDirection.MINIMIZE,
                                sampler=sampler, pruner=pruner)
    distributions = {p.field: p.distribution() for p in search.params}
    states = {"complete": optuna.trial.TrialState.COMPLETE, "pruned": optuna.trial.TrialState.PRUNED,
              "failed": optuna.trial.TrialState.FAIL}
    for record in records:
        if record.state not in states or set(record.params) != set(distributions):
            continue
        if any(not distributions[k]._contains(distributions[k].to_internal_repr(v)) for k, v in record.params.items()):
            continue  # recorded under another range (the spec changed): not evidence for this one
        value = record.value if record.state == "complete" else None
        if record.state == "complete" and (value is None or not math.isfinite(value)):
            continue
        study.add_trial(optuna.trial.create_trial(
            state=states[record.state], value=value, params=record.params, distributions=distributions,
            intermediate_values={int(k): float(v) for k, v in record.intermediate.items() if math.isfinite(v)},
        ))
    return study


MAX_REFUSED_POINTS = 100
"""Sampled points in a row whose config is refused before `search_ask` gives up: ranges whose
combinations are (almost) all invalid runs."""


def search_ask(
    *, search: SearchSpec, direction: str, seed: int, records: list[TrialRecord], build: Callable[[dict[str, Any]], RunConfig],
) -> tuple[dict[str, Any], RunConfig]:
    """The next trial's parameters (field -> value), by TPE over the records so far, and its config
    as `build(params)` makes it. Each range was checked at its ends alone; a combination may still
    be no valid run (`grpo.delta` must exceed 1 + `grpo.eps_high`, each inside its range). Such a
    point is told to the study as failed and the study asked again, so the search goes on with a
    valid one; the study is rebuilt from the same records each time, so the same records always
    give the same next point. ConfigError on `search` after MAX_REFUSED_POINTS refusals in a row."""
    import optuna

    study = build_study(search=search, direction=direction, seed=seed, records=records)
    distributions = {p.field: p.distribution() for p in search.params}
    refusal: ConfigError | None = None
    for _ in range(MAX_REFUSED_POINTS):
        trial = study.ask(distributions)
        params = {p.field: _plain(trial.params[p.field]) for p in search.params}
        try:
            return params, build(params)
        except ConfigError as exc:
            refusal = exc
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
    raise ConfigError("search", f"{MAX_REFUSED_POINTS} sampled points in a row make no valid run (the last: {refusal}); "
                                "narrow the ranges so that their combinations are valid")


def search_should_prune(
    *, search: SearchSpec, direction: str, seed: int, records: list[TrialRecord], params: dict[str, Any], intermediate: dict[int, float],
) -> bool:
    """Whether the pruner stops a running trial with these intermediate values, given the others."""
    import optuna

    if search.pruner == "none" or not intermediate:
        return False
    study = build_study(search=search, direction=direction, seed=seed, records=records)
    running = optuna.trial.create_trial(
        state=optuna.trial.TrialState.RUNNING, params=params, distributions={p.field: p.distribution() for p in search.params},
        intermediate_values=dict(intermediate),
    )
    return bool(study.pruner.prune(study, running))


def best_record(records: list[TrialRecord], direction: str) -> TrialRecord | None:
    """The complete trial with the best value; None before any, or when the best value is tied."""
    done = [r for r in records if r.state == "complete" and r.value is not None]
    if not done:
        return None
    sign = 1.0 if direction == "maximize" else -1.0
    top = max(sign * (r.value or 0.0) for r in done)
    leaders = [r for r in done if sign * (r.value or 0.0) == top]
    return leaders[0] if len(leaders) == 1 else None  # an exact tie: no trial is best


def _plain(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else value


# -- the sink that asks the pruner -----------------------------------------------------------------


class PruningSink:
    """Passes every event on to `inner`; after each held-out evaluation past step 0 it records the
    target metric and asks `decide(intermediate)`; once that says prune, `should_stop()` is true, so
    the trainer stops at its next step (and saves a checkpoint), like a cancel. A trial whose last
    evaluation trails has already finished: it counts as complete (its caller checks the status)."""

    def __init__(self, inner: EventSink, *, metric: str, decide: Callable[[dict[int, float]], bool]):
        self.inner = inner
        self.metric = metric
        self.decide = decide
        self.intermediate: dict[int, float] = {}
        self.pruned_at: int | None = None

    def run_started(self, *, total_steps: int, start_step: int) -> None:
        self.inner.run_started(total_steps=total_steps, start_step=start_step)

    def metrics(self, m: StepMetrics) -> None:
        self.inner.metrics(m)

    def rollouts(self, step: int, episodes: list[dict[str, Any]]) -> None:
        self.inner.rollouts(step, episodes)

    def log(self, message: str, *, level: str = "info") -> None:
        self.inner.log(message, level=level)

    def checkpoint(self, step: int, path: str) -> None:
        self.inner.checkpoint(step, path)

    def status(self, phase: str, detail: str, *, progress: float | None = None, eta: float | None = None) -> None:
        self.inner.status(phase, detail, progress=progress, eta=eta)

    def placed(self, where: dict[str, Any]) -> None:
        self.inner.placed(where)

    def plan(self, plan: dict[str, Any]) -> None:
        self.inner.plan(plan)

    def evaluation(self, result: dict[str, Any]) -> None:
        self.inner.evaluation(result)
        step = int(result.get("step", 0))
        value = trial_metrics([result]).get(self.metric)
        if step <= 0 or value is None or self.pruned_at is not None or step in self.intermediate:
            return  # step 0 is the untrained start; a step's later evaluation is the sampled one
        self.intermediate[step] = value
        if self.decide(dict(self.intermediate)):
            self.pruned_at = step
            self.inner.log(f"pruned at step {step}: {self.metric} {value:.3f} trails the median of the completed trials", level="warning")

    def should_stop(self) -> bool:
        return self.pruned_at is not None or self.inner.should_stop()
