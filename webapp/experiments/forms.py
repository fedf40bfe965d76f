"""The new-experiment form: a topology, a dataset and the base config (advanced YAML), then the
axes (YAML), the seeds, the metric that ranks the arms and its direction."""

from __future__ import annotations

import re
from typing import Any

from django import forms

from training.config import ConfigError
from training.experiment import DIRECTIONS, MAX_SEEDS, MAX_TRIALS
from webapp.core import trust
from webapp.core.console import printable
from webapp.models import Dataset, Team, Topology
from webapp.runs.forms import DatasetChoiceField, TopologyChoiceField

PROBLEM_FIELDS = {"axes": "axes_yaml", "search": "search_yaml", "seeds": "seeds", "metric": "metric", "direction": "direction",
                  "name": "name"}
"""Where the spec's problems are shown: a problem's place (`axes.optim.lr`, `seeds[1]`) by its first part."""

SEED_MAX = 2**32 - 1
SEED = re.compile(r"[0-9]{1,10}")
"""A seed as the form takes it: ASCII digits, at most ten (the engine refuses one above SEED_MAX, naming it)."""


class ExperimentForm(forms.Form):
    name = forms.CharField(max_length=100, required=False, help_text="Defaults to the topology's name.")
    topology = TopologyChoiceField(queryset=Topology.objects.none())
    dataset = DatasetChoiceField(queryset=Dataset.objects.none())
    conversations = forms.ModelChoiceField(queryset=Dataset.objects.none(), required=False, label="Conversations (SFT)",
                                           empty_label="none: the trials train with GRPO",
                                           help_text="If you pick one, every trial is supervised fine-tuning on it "
                                                     "(algorithm sft); the dataset above gives the held-out tasks.")
    advanced_yaml = forms.CharField(
        required=False, label="Base config (YAML)", max_length=trust.MAX_CONFIG_BYTES,
        widget=forms.Textarea(attrs={"rows": 5, "spellcheck": "false", "placeholder": "optim:\n  steps: 20\neval:\n  every: 5"}),
        help_text="Any RunConfig fields every trial shares, merged over the topology and dataset (as on the run form).",
    )
    axes_yaml = forms.CharField(
        required=False, label="Axes (YAML)", max_length=trust.MAX_CONFIG_BYTES,
        widget=forms.Textarea(attrs={"rows": 4, "spellcheck": "false",
                                     "placeholder": "optim.lr: [1.0e-4, 3.0e-4]\ntopology.specialization: [prompt, lora]"}),
        help_text=f"A grid: dotted config field -> list of values; every combination is one arm. Empty: seeds only. "
                  f"At most {MAX_TRIALS} runs in all.",
    )
    search_yaml = forms.CharField(
        required=False, label="Or a search (YAML)", max_length=trust.MAX_CONFIG_BYTES,
        widget=forms.Textarea(attrs={"rows": 5, "spellcheck": "false",
                                     "placeholder": "trials: 20\nparams:\n  optim.lr: {low: 1.0e-5, high: 1.0e-3, log: true}\n"
                                                    "  grpo.k: {low: 2, high: 8}\npruner: median"}),
        help_text="An Optuna search instead of a grid: a budget of trials over ranges (log: true for log-uniform, choices "
                  "for a list), each at the first seed; the median pruner stops trials whose held-out evaluations trail.",
    )
    seeds = forms.CharField(initial="0, 1, 2", max_length=1000, help_text="Each arm runs once per seed (the run's seed: data order, sampling, held-out draw).")
    metric = forms.CharField(initial="team.success", max_length=100,
                             help_text="Ranks the arms: team.success, or <agent>.success / <agent>.reward (held-out, greedy).")
    direction = forms.ChoiceField(choices=[(d, d) for d in DIRECTIONS], initial="maximize")

    def __init__(self, *args: Any, team: Team, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.fields["topology"].queryset = Topology.objects.filter(team=team)  # type: ignore[attr-defined]
        valid = Dataset.objects.filter(team=team, status=Dataset.Status.VALID)
        self.fields["dataset"].queryset = valid.exclude(kind=Dataset.Kind.CHATS)  # type: ignore[attr-defined]
        self.fields["conversations"].queryset = valid.filter(kind=Dataset.Kind.CHATS)  # type: ignore[attr-defined]

    def clean_axes_yaml(self) -> Any:
        text = self.cleaned_data.get("axes_yaml") or ""
        try:
            axes = trust.yaml_load(text, field="axes") if text.strip() else {}
        except ConfigError as exc:
            raise forms.ValidationError(exc.message) from None
        return axes if axes is not None else {}

    def clean_search_yaml(self) -> Any:
        text = self.cleaned_data.get("search_yaml") or ""
        try:
            return trust.yaml_load(text, field="search") if text.strip() else None
        except ConfigError as exc:
            raise forms.ValidationError(exc.message) from None

    def clean_seeds(self) -> list[int]:
        """Whole numbers written in ASCII digits: `str.isdigit` also passes `²` (which `int` refuses)
        and a 5,000-digit number (past `int`'s limit); the engine checks the range and repeats."""
        text = (self.cleaned_data.get("seeds") or "").strip().strip("[]")
        parts = [p.strip() for p in text.replace(",", " ").split()]
        if len(parts) > MAX_SEEDS:
            raise forms.ValidationError(f"At most {MAX_SEEDS} seeds (this lists {len(parts)}).")
        bad = [p for p in parts if not SEED.fullmatch(p)]
        if bad:
            raise forms.ValidationError(f"Seeds are whole numbers from 0 to {SEED_MAX}, like 0, 1, 2; not '{printable(bad[0], limit=40)}'.")
        return [int(p) for p in parts]

    def add_problem(self, problem: ConfigError) -> None:
        """An ExperimentError's problem, next to the field it concerns."""
        head = problem.field.split(".")[0].split("[")[0]
        field = PROBLEM_FIELDS.get(head, "advanced_yaml")
        self.add_error(field, str(problem) if field in ("axes_yaml", "search_yaml", "advanced_yaml") else problem.message)
