"""A run's charted series, encoded for the run page: the backlog (`metrics_message`, downsampled,
split into websocket-sized parts by `split_metrics`) and one live step (`metrics_delta`).

`metrics`: `{last, total, downsampled, run: {key: [[steps], [values]]}, agents: {agent: {key:
[[steps], [values]]}}, times: [[steps], [epoch]]}`. Only the charted series travel: those of
`CHARTS`, the run page's one list of charts, which the page's script reads from the page
(`chart_specs`). Values are null when not finite. Long series are downsampled on the server
(min-max per bucket, first and last point kept) to at most `MAX_POINTS` points each, so a
10,000-step run loads about as fast as a 2,000-step one.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from django.db import connections
from django.db.models import F, Func, Q, TextField, Value
from django.db.models.fields.json import KeyTransform
from django.db.models.functions import Cast

from webapp.core.series import downsample_minmax
from webapp.models import MetricPoint, Run

MAX_POINTS = 2000
"""Most points per series in a backlog (the chart cannot show more on a laptop screen anyway)."""

TIMES_TAIL = 50
"""(step, wall time) pairs sent with a backlog, for the page's ETA."""

CHUNK_POINTS = 20_000
"""Most points in one websocket message (~0.4 MB of JSON; Daphne refuses messages over 1 MiB)."""

REWARD_FN_PREFIX = "reward/fn/"
"""Run-wide series for each of the run's reward functions (`data.reward_fn`, `data.reward_fns`;
their means before the weights) and, in a run of a team's task, each of its graders and their parts
(`agents.envs.task`), charted together; which there are comes from the run's points."""


@dataclass(frozen=True)
class Chart:
    """One chart of the run page. The page's script (static/js/run-live.js) draws exactly these, in
    this order, from the JSON the page carries (`chart_specs`); the socket streams only their series."""

    id: str
    title: str
    run: tuple[str, ...] = ()
    """Run-wide series, one line each (named by `labels`, else "all agents" beside per-agent lines)."""
    agent: str | None = None
    """The per-agent series: one line per agent."""
    run_prefix: str | None = None
    """One line per run-wide series under this prefix (named by the rest of its key)."""
    evals: bool = False
    """The held-out evaluations (from the run's evaluation rows, not its step metrics)."""
    range: tuple[float, float] | None = None
    """A fixed y range (shares)."""
    labels: tuple[tuple[str, str], ...] = ()
    """(series, legend name) for run-wide series whose key reads badly in a legend."""

    def spec(self) -> dict[str, Any]:
        """The chart as run-live.js reads it."""
        out: dict[str, Any] = {"id": self.id, "title": self.title}
        if self.run:
            out["run"] = list(self.run)
        if self.agent:
            out["agent"] = self.agent
        if self.run_prefix:
            out["runPrefix"] = self.run_prefix
        if self.evals:
            out["evals"] = True
        if self.range:
            out["range"] = list(self.range)
        if self.labels:
            out["labels"] = dict(self.labels)
        return out


CHARTS = (
    Chart("reward", "Reward (total)", run=("reward/total",), agent="reward/total"),
    Chart("reward-team", "Team reward", run=("reward/team",), agent="reward/team"),
    Chart("reward-local", "Local reward", run=("reward/local",), agent="reward/local"),
    Chart("reward-fns", "Reward functions and graders (mean, before weights)", run_prefix=REWARD_FN_PREFIX),
    Chart("success", "Success rate", run=("success",), agent="success", range=(0, 1)),
    Chart("eval", "Held-out evaluation (success)", evals=True, range=(0, 1)),
    Chart("loss", "Loss", run=("loss",), agent="loss"),
    Chart("token-accuracy", "Token accuracy (SFT: assistant tokens the model ranks first)", run=("token_accuracy",),
          agent="token_accuracy", range=(0, 1)),
    Chart("kl", "KL to the reference", agent="kl"),
    Chart("entropy", "Entropy", agent="entropy"),
    Chart("grad-norm", "Gradient norm (before clipping to optim.max_grad_norm)", agent="grad_norm"),
    Chart("clip", "Clip ratio", agent="clip_region"),
    Chart("clip-low", "Clipped below (ratio < 1 − ε low, negative advantage)", agent="clip_low"),
    Chart("clip-high", "Clipped above (ratio > 1 + ε high, positive advantage)", agent="clip_high"),
    Chart("zero-signal", "Groups without signal (equal rewards)", run=("zero_std_frac",), agent="zero_std_frac", range=(0, 1)),
    Chart("adv-mean", "Advantage mean (0 unless shaping or masking moved it)", agent="adv/mean"),
    Chart("adv-std", "Advantage spread (std)", agent="adv/std"),
    Chart("ended", "Completions that ended on their own", agent="ended", range=(0, 1)),
    Chart("mismatch", "Sampler/trainer mismatch, mean |Δ log p| (importance-corrected runs)", agent="mismatch/logp_diff"),
    Chart("mismatch-capped", "Tokens whose importance weight was capped (importance-corrected runs)", agent="mismatch/capped", range=(0, 1)),
    Chart("mismatch-weight", "Mean importance weight min(π trainer / π sampler, cap) (importance-corrected runs)", agent="mismatch/is_weight"),
    Chart("async-staleness", "Rollout staleness: updates between sampling and training (async)", agent="async/staleness"),
    Chart("async-wait", "Async: what each step waited for (s)", run=("async/wait_time", "async/push_time"),
          labels=(("async/wait_time", "rollouts"), ("async/push_time", "weights to the sampler"))),
    Chart("tool-calls", "Tool calls per candidate", run=("tool_calls",)),
    Chart("tool-errors", "Tool calls that failed", run=("tool_errors",), range=(0, 1)),
    Chart("dynamic", "Dynamic sampling: extra batches per step", run=("dynamic/extra_batches",)),
    Chart("dynamic-kept", "Dynamic sampling: share of the step's tasks with a signal", run=("dynamic/signal_tasks",), range=(0, 1)),
    Chart("len", "Completion length (tokens)", run=("completion_len",), agent="completion_len"),
    Chart("step-time", "Step time (s)", run=("step_time", "rollout_time", "update_time"),
          labels=(("step_time", "step"), ("rollout_time", "rollout"), ("update_time", "update"))),
    Chart("tps", "Generated tokens / s", run=("tokens_per_s",)),
)
"""Every chart of the run page: the one list the page's script and the socket read. `tool_*` only
runs whose agents call tools have, `dynamic/*` only runs with `grpo.dynamic_sampling`, `mismatch/*`
only runs that sample with vLLM or `generation.async` (`training.grpo.sampler_mismatch`), `async/*`
only runs with `generation.async`, `loss` run-wide and `token_accuracy` only SFT runs; a chart
without points stays hidden. The summary card's table shows every metric of the latest step."""

RUN_SERIES = tuple(dict.fromkeys(key for chart in CHARTS for key in chart.run))
"""Run-wide metrics the page charts, and so streams (besides `REWARD_FN_PREFIX`'s)."""

AGENT_SERIES = tuple(dict.fromkeys(chart.agent for chart in CHARTS if chart.agent))
"""Per-agent metrics the page charts, and so streams."""

RUN_NOT_CHARTED = {
    "reward/std": "the spread of the step's rewards; whether groups carry a signal is charted (zero_std_frac, adv/std)",
    "truncated": "1 − ended, which is charted per agent",
    "ended": "charted per agent",
    "turns": "turns per episode; the rollout viewer shows each episode's",
    "segment_len": "tool runs: the longest segment between two calls (what max_new_tokens caps); completion_len is charted",
    "generated_tokens": "a count; the rate (tokens_per_s) is charted",
    "async/staleness": "the same for every agent: charted per agent",
    "tokens": "SFT: assistant tokens in the step's batch, fixed by the data and sft.batch_size",
}
"""Run-wide metrics the engine reports that the page does not chart, and why (the summary card's
table and the trackers still show them). tests/webapp/runs/test_charted_metrics.py fails when the
engine reports a metric that is neither charted nor here."""

AGENT_NOT_CHARTED = {
    "reward/std": RUN_NOT_CHARTED["reward/std"],
    "truncated": RUN_NOT_CHARTED["truncated"],
    "lr": "the learning-rate schedule, which the config fixes (optim.lr, warmup, decay)",
    "samples": "samples in the update, fixed by grpo.k and optim.tasks_per_step (less the groups without signal, charted)",
    "tokens": RUN_NOT_CHARTED["tokens"],
    "examples": "SFT: conversations in the step's batch, fixed by sft.batch_size",
}
"""Per-agent metrics the engine reports that the page does not chart, and why."""


def chart_specs() -> list[dict[str, Any]]:
    """The run page's charts as its script reads them (rendered into the page as JSON)."""
    return [chart.spec() for chart in CHARTS]


def metrics_message(*, run_id: int, since: int | None = None, until: int | None = None, total: int = 0,
                    max_points: int = MAX_POINTS, run_wide: bool = True, per_agent: bool = True) -> dict[str, Any]:
    """The charted series of a run for steps in (`since`, `until`], each downsampled to
    `max_points`; the run-wide ones, the per-agent ones, or both. A resumed run's series start
    with its ancestors' points up to the resumed step (`Run.metric_lineage`); the ETA's times
    are the run's own.

    The database pulls the charted numbers out of the JSON columns (`_series_table`), so a
    10,000-step run costs one query and one numpy parse, not 20,000 json.loads."""
    run = Run.objects.filter(pk=run_id).only("pk", "resumed_from_id", "resumed_at_step", "config_yaml").first()
    rows = MetricPoint.objects.filter(run.metric_lineage() if run is not None else Q(run_id=run_id))
    if since is not None:
        rows = rows.filter(step__gt=since)
    if until is not None:
        rows = rows.filter(step__lte=until)
    columns: list[tuple[str | None, str]] = [(None, key) for key in RUN_SERIES + _reward_fn_keys(rows)] if run_wide else []
    if per_agent:
        columns += [(agent, key) for agent in _agent_names(run, rows) for key in AGENT_SERIES]
    table = _series_table(rows, columns)  # (N, 1 + C)
    steps = table[:, 0].astype(np.int64) if len(table) else np.zeros(0, dtype=np.int64)  # (N,)
    downsampled = False
    run_series: dict[str, list[list[Any]]] = {}
    agent_series: dict[str, dict[str, list[list[Any]]]] = {}
    for i, (agent, key) in enumerate(columns, start=1):
        values = table[:, i] if len(table) else np.zeros(0)  # (N,)
        present = np.isfinite(values)  # (N,) missing, null (a NaN the sink stored) and inf are no points
        xs, ys = steps[present], values[present]  # (n,)
        if not len(xs):
            continue
        if len(xs) > max_points:
            downsampled = True
            keep = downsample_minmax(ys, max_points)
            xs, ys = xs[keep], ys[keep]
        (run_series if agent is None else agent_series.setdefault(agent, {}))[key] = [xs.tolist(), _round(ys)]
    own = MetricPoint.objects.filter(run_id=run_id)
    if since is not None:
        own = own.filter(step__gt=since)
    if until is not None:
        own = own.filter(step__lte=until)
    recent = list(own.order_by("-step").values_list("step", "time")[:TIMES_TAIL])[::-1]
    return {
        "t": "metrics",
        "last": int(steps[-1]) if len(steps) else None,
        "total": total,
        "downsampled": downsampled,
        "run": run_series,
        "agents": agent_series,
        "times": [[s for s, _ in recent], [t.timestamp() for _, t in recent]],
    }


def _series_table(rows: Any, columns: list[tuple[str | None, str]]) -> np.ndarray:
    """Step and one float column per (agent or None for run-wide, key), in step order; NaN where
    a point lacks the key or holds something else than a number.

    The database pulls each group's numbers (run-wide; each agent's) out of the JSON column as one
    small JSON array per row (SQLite: one JSON_EXTRACT with every path, so the row's text is
    parsed once, not once per key; PostgreSQL: jsonb_build_array of the keys), and numpy parses
    all those arrays at once."""
    if not columns:
        steps = list(rows.order_by("step").values_list("step", flat=True))
        return np.array(steps, dtype=np.float64).reshape(-1, 1)
    sqlite = connections[rows.db].vendor == "sqlite"
    groups: dict[str | None, list[str]] = {}
    for agent, key in columns:
        groups.setdefault(agent, []).append(key)
    exprs: dict[str, Any] = {}
    widths: list[int] = []
    for i, (agent, keys) in enumerate(groups.items()):
        field = "values" if agent is None else "agents"
        if sqlite:
            # Two paths at least, so SQLite answers with a JSON array (one path gives the bare value).
            paths = [_json_path(*([agent] if agent else []), key) for key in keys] + ["$.__pad__"]
            exprs[f"g{i}"] = Func(F(field), *[Value(p) for p in paths], function="JSON_EXTRACT", output_field=TextField())
        else:
            source: Any = field if agent is None else KeyTransform(agent, field)
            exprs[f"g{i}"] = Cast(Func(*[KeyTransform(key, source) for key in keys], function="JSONB_BUILD_ARRAY"), TextField())
        widths.append(len(keys) + (1 if sqlite else 0))
    data = list(rows.annotate(**exprs).order_by("step").values_list("step", *exprs))
    blocks = [np.array([row[0] for row in data], dtype=np.float64).reshape(-1, 1)]  # (N, 1)
    for j, (keys, width) in enumerate(zip(groups.values(), widths), start=1):
        blocks.append(_json_arrays([row[j] for row in data], width)[:, : len(keys)])  # (N, keys)
    return np.hstack(blocks)


def _json_arrays(texts: list[str | None], width: int) -> np.ndarray:
    """Rows of JSON number arrays (`[1.5,null,2]`, each `width` long) as an (N, width) float
    matrix, null -> NaN. One C-level parse of all of them; a row holding anything but numbers
    and nulls (a string or a boolean someone logged) sends the lot through json.loads instead."""
    if texts and all(texts):
        try:
            flat = np.fromstring(",".join(t[1:-1] for t in texts if t).replace("null", "nan"), sep=",")  # (N*width,)
            if flat.size == len(texts) * width:
                return flat.reshape(len(texts), width)
        except ValueError:
            pass
    rows = [json.loads(t) if t else [None] * width for t in texts]
    return np.array([[v if isinstance(v, (int, float)) and not isinstance(v, bool) else None for v in row[:width]]
                     + [None] * (width - len(row)) for row in rows], dtype=np.float64).reshape(len(texts), width)


def _json_path(*keys: str) -> str:
    return "$" + "".join("." + json.dumps(key) for key in keys)


def split_metrics(message: dict[str, Any], chunk_points: int = CHUNK_POINTS, *, final: bool = True) -> list[dict[str, Any]]:
    """A metrics message as several, none above `chunk_points` points: whole series per message,
    the run-wide ones first; the times ride with the first. Each merges on its own on the page;
    only the last carries `final` (when `final`), and only a final message moves the page's
    reconnect cursor, so a socket that drops mid-way asks for the same steps again."""
    parts: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    size = 0

    def new() -> dict[str, Any]:
        part = {k: v for k, v in message.items() if k not in ("run", "agents", "times")}
        part.update(run={}, agents={}, times=[[], []] if parts else message["times"])
        parts.append(part)
        return part

    for agent, key, series in [(None, k, v) for k, v in message["run"].items()] + [
        (a, k, v) for a, cols in message["agents"].items() for k, v in cols.items()
    ]:
        if current is None or (size and size + len(series[0]) > chunk_points):
            current, size = new(), 0
        size += len(series[0])
        (current["run"] if agent is None else current["agents"].setdefault(agent, {}))[key] = series
    parts = parts or [dict(message)]
    for i, part in enumerate(parts):
        part["final"] = final and i == len(parts) - 1
    return parts


def _round(values: np.ndarray) -> list[float]:
    """Six significant digits: plenty for a chart, and half the JSON of full float reprs."""
    return [float(f"{v:.6g}") for v in values.tolist()]


def _agent_names(run: Run | None, rows: Any) -> list[str]:
    """The run's agents in acting order (its config), then any other agent its points name."""
    names: list[str] = []
    if run is not None:
        try:
            names = [a.name for a in run.to_config().topology.agents]
        except (ValueError, TypeError, AttributeError):
            names = []
    for ordering in ("step", "-step"):
        for agents in rows.order_by(ordering).values_list("agents", flat=True)[:1]:
            names += [name for name in (agents or {}) if name not in names]
    return names


def _reward_fn_keys(rows: Any) -> tuple[str, ...]:
    """The `reward/fn/<name>` keys of these points, from the first and the last (a run's reward
    functions are fixed by its config; a resumed run's lineage could differ at its ends)."""
    keys: set[str] = set()
    for ordering in ("step", "-step"):
        for values in rows.order_by(ordering).values_list("values", flat=True)[:1]:
            keys.update(k for k in (values or {}) if isinstance(k, str) and k.startswith(REWARD_FN_PREFIX))
    return tuple(sorted(keys))


def metrics_delta(payload: Mapping[str, Any]) -> dict[str, Any]:
    step = int(payload["step"])

    def one(values: Mapping[str, Any] | None, keys: tuple[str, ...], prefix: str | None = None) -> dict[str, list[list[Any]]]:
        return {
            k: [[step], [finite(v)]] for k, v in (values or {}).items()
            if (k in keys or (prefix and isinstance(k, str) and k.startswith(prefix)))
            and isinstance(v, (int, float)) and not isinstance(v, bool)
        }

    return {
        "t": "metrics",
        "last": step,
        "total": payload.get("total_steps"),
        "downsampled": False,
        "run": one(payload.get("values"), RUN_SERIES, REWARD_FN_PREFIX),
        "agents": {name: one(v, AGENT_SERIES) for name, v in (payload.get("agents") or {}).items()},
        "times": [[step], [payload.get("time")]],
        "final": True,
    }


def finite(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None
