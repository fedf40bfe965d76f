"""Forms of the jobs a run page and the playground start: an evaluation, a playground task."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django import forms
from django.db.models import QuerySet
from django.urls import reverse

from webapp.core.values import id_or_none
from webapp.models import Checkpoint, Dataset, Run, Team, Topology


class CheckpointChoiceField(forms.ModelChoiceField):
    def label_from_instance(self, obj: Checkpoint) -> str:  # type: ignore[override]
        return f"step {obj.step}"


class EvaluationForm(forms.Form):
    """Evaluate one of the run's checkpoints (or the base models) on a dataset's held-out split."""

    checkpoint = CheckpointChoiceField(queryset=Checkpoint.objects.none(), required=False, empty_label="base models (no training)")
    dataset = forms.ModelChoiceField(queryset=Dataset.objects.none())

    def __init__(self, *args: Any, run: Run, **kwargs: Any):
        super().__init__(*args, **kwargs)
        on_disk = [c.pk for c in run.checkpoints.kept() if Path(c.path).is_dir()]  # checkpoint.keep deletes old ones
        checkpoints: QuerySet[Checkpoint] = run.checkpoints.filter(pk__in=on_disk).order_by("-step")
        self.fields["checkpoint"].queryset = checkpoints  # type: ignore[attr-defined]
        self.fields["dataset"].queryset = Dataset.objects.filter(  # type: ignore[attr-defined]
            team_id=run.team_id, environment=run.environment or "math_tool", status=Dataset.Status.VALID)
        if not self.is_bound:
            self.initial.setdefault("checkpoint", checkpoints.first())
            self.initial.setdefault("dataset", run.dataset_id)


# -- playground ---------------------------------------------------------------------------------------

RECENT_RUNS = 30


def playground_agent_choices(team: Team) -> list[tuple[str, list[tuple[str, str]]]]:
    """Grouped choices: each topology's base models, then the checkpoints of recent runs."""
    topologies = [(f"t:{t.pk}", f"{t.name} — base models ({t.environment}, {t.specialization})")
                  for t in Topology.objects.filter(team=team).order_by("name")]
    checkpoints = Checkpoint.objects.kept().filter(run__team=team, run__archived=False).select_related("run") \
        .order_by("-run__created", "-step")
    recent: dict[int, list[Checkpoint]] = {}
    for c in checkpoints[:200]:
        if not Path(c.path).is_dir():  # deleted by checkpoint.keep
            continue
        if c.run_id in recent or len(recent) < RECENT_RUNS:
            recent.setdefault(c.run_id, []).append(c)
    trained = [(f"c:{c.pk}", f"#{c.run_id} {c.run.name} — step {c.step} ({c.run.specialization or '?'})")
               for cs in recent.values() for c in cs]
    groups = []
    if trained:
        groups.append(("Trained checkpoints", trained))
    if topologies:
        groups.append(("Base models of a topology", topologies))
    return groups


def playground_agents(team: Team, value: str) -> Topology | Checkpoint | None:
    """The topology (`t:<id>`) or checkpoint (`c:<id>`) of this team a choice names."""
    kind, _, text = (value or "").partition(":")
    pk = id_or_none(text)
    if pk is None:
        return None
    if kind == "t":
        return Topology.objects.filter(team=team, pk=pk).first()
    if kind == "c":
        return Checkpoint.objects.filter(run__team=team, pk=pk).select_related("run").first()
    return None


class PlaygroundForm(forms.Form):
    agents = forms.CharField(label="Agents", widget=forms.Select, help_text="A run's trained checkpoint, or a topology's base models.")
    with_base = forms.BooleanField(required=False, initial=True, label="Side by side with the base models",
                                   help_text="Play the same task with the untrained base models too (checkpoints only).")
    temperature = forms.FloatField(initial=0.0, min_value=0.0, max_value=2.0, widget=forms.TextInput,
                                   help_text="0 is greedy (what evaluation uses).")
    max_new_tokens = forms.IntegerField(required=False, min_value=1, max_value=1024, help_text="Per turn; empty uses the run's.")

    def __init__(self, *args: Any, team: Team, task_fields: tuple[str, ...] = (), **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.team = team
        # Any checkpoint of the team is accepted (clean_agents); the list offers the recent ones.
        self.fields["agents"].widget.choices = [("", "— pick agents —"), *playground_agent_choices(team)]  # type: ignore[attr-defined]
        self.fields["agents"].widget.attrs.update({  # a change refreshes the task fields for its environment
            "hx-get": reverse("playground"), "hx-target": "#task-fields", "hx-swap": "outerHTML", "hx-trigger": "change",
        })
        self.task_fields = task_fields
        for i, name in enumerate(task_fields):
            widget = forms.Textarea(attrs={"rows": 3 if i == 0 else 1, "spellcheck": "false"})
            self.fields[f"task_{name}"] = forms.CharField(
                label=name, required=i == 0, strip=False, widget=widget,
                help_text="The task." if i == 0 else "Used to score the agents; may stay empty. JSON lists/objects are parsed.",
            )

    def clean_agents(self) -> Topology | Checkpoint:
        chosen = playground_agents(self.team, self.cleaned_data.get("agents", ""))
        if chosen is None:
            raise forms.ValidationError("Pick agents from the list.")
        return chosen

    def task_inputs(self) -> list[forms.BoundField]:
        return [self[f"task_{name}"] for name in self.task_fields]

    def task_values(self) -> dict[str, str]:
        return {name: self.cleaned_data.get(f"task_{name}") or "" for name in self.task_fields}
