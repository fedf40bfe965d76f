"""The shared experiment history's reads: search and filters over a team's runs, comparison
(metric series, held-out results, config diff) and CSV export. The labels (tags, notes, archive)
are written by `webapp.history.services`.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, fields, replace
from datetime import date, datetime, time
from typing import Any
from urllib.parse import urlencode

import numpy as np
import yaml
from django.core.exceptions import ValidationError
from django.db.models import F, FloatField, Q, QuerySet
from django.db.models.fields.json import KeyTextTransform, KeyTransform
from django.db.models.functions import Cast
from django.utils import timezone

from webapp.core.series import downsample_minmax
from webapp.core.values import ID_MAX, csv_cell, id_or_none
from webapp.models import Evaluation, MetricPoint, Run, Team

METRIC_KEY = re.compile(r"^[\w./:-]{1,100}$")
"""What a metric name may look like in a sort or compare request (the engine's `reward/total`)."""


SORTS = ("-created", "created", "name", "-name", "status", "-status")


COMPARE_MIN, COMPARE_MAX = 2, 8


MAX_POINTS = 1000
"""Points per curve on the compare chart (min-max downsampled on the server)."""


# == finding runs ====================================================================================


@dataclass(frozen=True)
class RunFilter:
    """The run list's filters, parsed leniently from a query string (a bad value is ignored)."""

    q: str = ""
    status: str = ""
    topology: int | None = None
    dataset: int | None = None
    environment: str = ""
    specialization: str = ""
    algorithm: str = ""
    """`grpo` or `sft` (`Run.algorithm`)."""
    owner: int | None = None
    tag: str = ""
    created_from: date | None = None
    created_to: date | None = None
    archived: str = ""
    """"" hides archived runs, `all` shows them too, `only` shows nothing else."""
    sort: str = "-created"
    """`created`, `name`, `status` or a final metric as `metric:<key>`; a `-` prefix sorts
    descending (`-created`, the default, is newest first; `-metric:success` highest first)."""

    problems: tuple[tuple[str, str], ...] = ()
    """What was wrong with the query string, as (parameter, sentence): those parameters are ignored
    (the run list says so; the API and the CSV export answer 400)."""

    @classmethod
    def from_query(cls, query: Mapping[str, Any]) -> RunFilter:
        problems: dict[str, str] = {}

        def text(name: str, limit: int = 200) -> str:
            value = str(query.get(name) or "").strip()
            if "\x00" in value:
                problems[name] = "Contains a NUL character."
                return ""
            return value[:limit]

        def number(name: str) -> int | None:
            value = text(name, 40)
            if not value:
                return None
            if not (value.isascii() and value.isdigit()) or int(value) > ID_MAX:
                problems[name] = f"{value[:30]!r} is not an id."
                return None
            return int(value)

        def day(name: str) -> date | None:
            value = text(name, 40)
            if not value:
                return None
            try:
                return date.fromisoformat(value)
            except ValueError:
                problems[name] = f"{value[:30]!r} is not a date (YYYY-MM-DD)."
                return None

        sort = text("sort", 110)
        if sort not in SORTS and not _metric_sort_key(sort):
            sort = "-created"
        return cls(
            q=text("q"), status=text("status", 20) if text("status", 20) in Run.Status.values else "",
            topology=number("topology"), dataset=number("dataset"), environment=text("environment"),
            specialization=text("specialization", 10), algorithm=text("algorithm", 10), owner=number("owner"), tag=text("tag", 40),
            created_from=day("created_from"), created_to=day("created_to"),
            archived=text("archived", 4) if text("archived", 4) in ("all", "only") else "", sort=sort,
            problems=tuple(problems.items()),
        )

    def params(self, **changes: Any) -> dict[str, str]:
        """The non-default filters as query parameters (with `changes` applied)."""
        current = replace(self, **changes) if changes else self
        out = {}
        for f in fields(self):
            if f.name == "problems":
                continue
            value = getattr(current, f.name)
            if value not in (None, "") and value != f.default:
                out[f.name] = value.isoformat() if isinstance(value, date) else str(value)
        return out

    def query_string(self, **changes: Any) -> str:
        return urlencode(self.params(**changes))

    @property
    def is_filtered(self) -> bool:
        return any(key != "sort" for key in self.params())

    @property
    def metric(self) -> str | None:
        """The final metric the list is sorted by, if any."""
        return _metric_sort_key(self.sort)


def _metric_sort_key(sort: str) -> str | None:
    key = sort.removeprefix("-").removeprefix("metric:") if sort.lstrip("-").startswith("metric:") else ""
    return key if METRIC_KEY.match(key) else None


def run_search(*, team: Team, filters: RunFilter) -> QuerySet[Run]:
    """The team's runs matching `filters`, sorted, with what the list shows joined in (the list's
    query count does not grow with its length)."""
    runs = Run.objects.filter(team=team).select_related("owner", "topology", "dataset").prefetch_related("tags")
    f = filters
    if f.archived == "":
        runs = runs.filter(archived=False)
    elif f.archived == "only":
        runs = runs.filter(archived=True)
    if f.status:
        runs = runs.filter(status=f.status)
    if f.topology is not None:
        runs = runs.filter(topology_id=f.topology)
    if f.dataset is not None:
        runs = runs.filter(dataset_id=f.dataset)
    if f.environment:
        runs = runs.filter(environment=f.environment)
    if f.specialization:
        runs = runs.filter(specialization=f.specialization)
    if f.algorithm:
        runs = runs.filter(algorithm=f.algorithm)
    if f.owner is not None:
        runs = runs.filter(owner_id=f.owner)
    if f.tag:
        runs = runs.filter(tags__name=f.tag)
    if f.created_from:
        runs = runs.filter(created__gte=_day_start(f.created_from))
    if f.created_to and f.created_to < date.max:  # the last day there is has no day after it
        runs = runs.filter(created__lt=_day_start(f.created_to + timezone.timedelta(days=1)))
    if f.q:
        words = f.q.split()
        for word in words[:8]:
            runs = runs.filter(Q(name__icontains=word) | Q(notes__icontains=word))
    metric = f.metric
    if metric:
        value = Cast(KeyTextTransform(metric, "final_metrics"), FloatField())
        runs = runs.annotate(sort_value=value)
        order = F("sort_value").desc(nulls_last=True) if f.sort.startswith("-") else F("sort_value").asc(nulls_last=True)
        return runs.order_by(order, "-created", "-id")
    return runs.order_by(f.sort, "-id" if f.sort.startswith("-") else "id")


def _day_start(day: date) -> datetime:
    return timezone.make_aware(datetime.combine(day, time.min))


@dataclass
class FilterChoices:
    topologies: list[tuple[int, str]]
    datasets: list[tuple[int, str]]
    environments: list[str]
    specializations: list[str]
    algorithms: list[str]
    owners: list[tuple[int, str]]
    tags: list[str]
    metrics: list[str]


def run_filter_choices(*, team: Team) -> FilterChoices:
    """What the filter bar offers: a handful of small queries, whatever the number of runs."""
    from django.contrib.auth.models import User

    runs = Run.objects.filter(team=team)
    unordered = runs.order_by()  # DISTINCT over the model's ordering columns would repeat each value per run
    recent = runs.order_by("-created").values_list("final_metrics", flat=True)[:200]
    metrics = sorted({k for m in recent if isinstance(m, dict) for k, v in m.items() if isinstance(v, (int, float))})
    return FilterChoices(
        topologies=list(team.topologies.order_by("name").values_list("id", "name")),
        datasets=list(team.datasets.order_by("name").values_list("id", "name")),
        environments=sorted(e for e in unordered.values_list("environment", flat=True).distinct() if e),
        specializations=sorted(s for s in unordered.values_list("specialization", flat=True).distinct() if s),
        algorithms=sorted(a for a in unordered.values_list("algorithm", flat=True).distinct() if a),
        owners=list(User.objects.filter(memberships__team=team).order_by("username").values_list("id", "username")),
        tags=list(team.tags.order_by("name").values_list("name", flat=True)),
        metrics=metrics,
    )


# == exporting the table =============================================================================

CSV_COLUMNS = ("id", "name", "status", "archived", "topology", "dataset", "environment", "specialization", "algorithm", "owner",
               "tags", "notes", "created", "started", "finished", "step", "total_steps")


def run_export_csv(*, runs: QuerySet[Run], metrics: Iterable[str] = ()) -> Iterator[str]:
    """The filtered table as CSV, a line at a time (for a streamed download)."""
    metric_keys = list(metrics)
    buffer = io.StringIO()
    writer = csv.writer(buffer)

    def line(cells: Iterable[Any]) -> str:
        buffer.seek(0)
        buffer.truncate()
        writer.writerow([csv_cell(c) for c in cells])
        return buffer.getvalue()

    yield line([*CSV_COLUMNS, *(f"final:{k}" for k in metric_keys)])
    for run in runs.iterator(chunk_size=500):  # tags are prefetched per chunk
        final = run.final_metrics if isinstance(run.final_metrics, dict) else {}
        yield line([
            run.pk, run.name, run.status, run.archived, run.topology.name if run.topology else "",
            run.dataset.name if run.dataset else "", run.environment, run.specialization, run.algorithm,
            run.owner.username if run.owner else "", ", ".join(t.name for t in run.tags.all()), run.notes,
            run.created, run.started, run.finished, run.step, run.total_steps,
            *(final.get(k) if isinstance(final.get(k), (int, float)) else "" for k in metric_keys),
        ])


# == comparing runs ===================================================================================


def compare_runs(*, team: Team, ids: Iterable[Any]) -> list[Run]:
    """The 2 to 8 runs to compare, in the order given. Raises Run.DoesNotExist when one is not the
    team's (the view answers 404), ValidationError when there are too few or too many."""
    given = list(ids)
    bad = [str(i) for i in given if id_or_none(i) is None]
    if bad:
        raise ValidationError(f"{bad[0][:30]!r} is not a run id.")
    wanted = list(dict.fromkeys(pk for pk in map(id_or_none, given) if pk is not None))
    if not COMPARE_MIN <= len(wanted) <= COMPARE_MAX:
        raise ValidationError(f"Pick {COMPARE_MIN} to {COMPARE_MAX} runs to compare (got {len(wanted)}).")
    runs = Run.objects.filter(team=team, pk__in=wanted).select_related("topology", "dataset", "owner").in_bulk()
    if len(runs) != len(wanted):
        raise Run.DoesNotExist
    return [runs[i] for i in wanted]


def run_agent_names(run: Run) -> list[str]:
    """Agent names in acting order, from the config snapshot (empty when it cannot be read)."""
    try:
        tree = yaml.safe_load(run.config_yaml) or {}
        return [str(a["name"]) for a in tree["topology"]["agents"]]
    except (yaml.YAMLError, KeyError, TypeError):
        return []


def compare_metric_names(*, runs: list[Run]) -> list[str]:
    """Metrics recorded by the runs (run-level and per agent), from their latest step each."""
    names: set[str] = set()
    for run in runs:  # at most 8
        row = MetricPoint.objects.filter(run=run).order_by("-step").values_list("values", "agents").first()
        if not row:
            continue
        values, agents = row
        names.update(k for k, v in (values or {}).items() if isinstance(v, (int, float)))
        for per_agent in (agents or {}).values():
            names.update(k for k, v in (per_agent or {}).items() if isinstance(v, (int, float)))
    first = ["reward/total", "success", "reward/team", "reward/local", "loss"]
    return [n for n in first if n in names] + sorted(names - set(first))


def compare_series(*, runs: list[Run], metric: str, max_points: int = MAX_POINTS) -> dict[str, Any]:
    """One metric's curves for each run (run-level and per agent), min-max downsampled. Only the
    metric's numbers leave the database (JSON key extraction), not the whole step rows."""
    if not METRIC_KEY.match(metric):
        raise ValidationError(f"Unknown metric {metric[:60]!r}.")
    out: dict[str, Any] = {"metric": metric, "runs": [], "downsampled": False}
    for run in runs:
        agents = run_agent_names(run)
        columns = {"v": KeyTransform(metric, "values")}
        columns.update({f"a{i}": KeyTransform(metric, KeyTransform(name, "agents")) for i, name in enumerate(agents)})
        rows = list(MetricPoint.objects.filter(run=run).order_by("step").annotate(**columns).values_list("step", *columns))
        steps = [r[0] for r in rows]
        series = {"run": _downsampled(steps, [r[1] for r in rows], max_points)}
        series["agents"] = {name: _downsampled(steps, [r[2 + i] for r in rows], max_points) for i, name in enumerate(agents)}
        out["downsampled"] |= len(steps) > max_points
        out["runs"].append({"id": run.pk, "name": run.name, "run": series["run"], "agents": series["agents"]})
    return out


def _downsampled(steps: list[int], values: list[Any], max_points: int) -> list[list[Any]]:
    pairs = [(s, float(v)) for s, v in zip(steps, values) if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if not pairs:
        return [[], []]
    ys = np.asarray([v for _, v in pairs], dtype=np.float64)  # (N,)
    keep = downsample_minmax(ys, max_points)
    return [[pairs[i][0] for i in keep], [pairs[i][1] if np.isfinite(pairs[i][1]) else None for i in keep]]


@dataclass
class HeldOut:
    """A run's held-out evaluation at its first and latest step (greedy temperature)."""

    first_step: int | None = None
    last_step: int | None = None
    team: tuple[float | None, float | None] = (None, None)
    agents: dict[str, tuple[float | None, float | None]] | None = None

    @property
    def team_delta(self) -> float | None:
        a, b = self.team
        return None if a is None or b is None else b - a


def run_held_out(*, runs: list[Run]) -> dict[int, HeldOut]:
    """First and latest greedy evaluation per run (one query for all runs)."""
    by_run: dict[int, list[Evaluation]] = {}
    for e in Evaluation.objects.filter(run__in=runs).order_by("run_id", "step", "temperature"):
        by_run.setdefault(e.run_id, []).append(e)
    return {run.pk: held_out_of(evaluations=by_run.get(run.pk, [])) for run in runs}


def held_out_of(*, evaluations: list[Evaluation]) -> HeldOut:
    """The first and latest greedy evaluation among `evaluations` (ordered by step)."""
    greedy_t = min((e.temperature for e in evaluations), default=0.0)
    evals = [e for e in evaluations if e.temperature == greedy_t]
    if not evals:
        return HeldOut(agents={})
    first, last = evals[0], evals[-1]
    names = list(dict.fromkeys([*first.agents, *last.agents]))
    return HeldOut(
        first_step=first.step, last_step=last.step, team=(first.team_success, last.team_success),
        agents={n: (_num((first.agents.get(n) or {}).get("success")), _num((last.agents.get(n) or {}).get("success")))
                for n in names},
    )


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def compare_final_table(*, runs: list[Run]) -> list[tuple[str, list[Any]]]:
    """Final metrics as rows (metric, value per run)."""
    keys: dict[str, None] = {}
    for run in runs:
        for k, v in (run.final_metrics or {}).items():
            if isinstance(v, (int, float)):
                keys[k] = None
    return [(k, [(run.final_metrics or {}).get(k) for run in runs]) for k in sorted(keys)]


@dataclass
class DiffRow:
    key: str
    values: list[str]
    differs: bool


def config_flatten(tree: Any, prefix: str = "") -> dict[str, str]:
    """A config tree as dotted keys (`grpo.k`, `topology.agents[1].role`) -> short YAML values."""
    out: dict[str, str] = {}
    if isinstance(tree, dict) and tree:
        for key, value in tree.items():
            out.update(config_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    elif isinstance(tree, list) and tree and any(isinstance(v, (dict, list)) for v in tree):
        for i, value in enumerate(tree):
            out.update(config_flatten(value, f"{prefix}[{i}]"))
    else:
        out[prefix] = json.dumps(tree, ensure_ascii=False) if not isinstance(tree, str) else tree
    return out


def compare_config_diff(*, runs: list[Run], differences_only: bool = False) -> list[DiffRow]:
    """The runs' config snapshots side by side, key by key (`config_diff`)."""
    return config_diff(configs=[run.config_yaml for run in runs], differences_only=differences_only)


def config_diff(*, configs: list[str], differences_only: bool = False) -> list[DiffRow]:
    """Config YAML texts side by side, key by key; `differs` marks keys whose values are not all
    equal (a key missing from one counts as different). `name` is left out."""
    flat = []
    for text in configs:
        try:
            tree = yaml.safe_load(text) or {}
        except yaml.YAMLError:
            tree = {}
        flat.append(config_flatten(tree if isinstance(tree, dict) else {}))
    keys = list(dict.fromkeys(k for f in flat for k in f if k != "name"))
    # an empty mapping or list in one run and keys under it in another is one difference, shown on
    # those keys ("topology.env_args.level: — / 1"), not a second row for the empty value
    nested = {k for k in keys if any(other.startswith((k + ".", k + "[")) for other in keys)}
    keys = [k for k in keys if k not in nested]
    for f in flat:
        for k in nested:
            f.pop(k, None)
    rows = []
    for key in keys:
        values = [f.get(key, "—") for f in flat]
        differs = len(set(values)) > 1
        if differs or not differences_only:
            rows.append(DiffRow(key, values, differs))
    return rows
