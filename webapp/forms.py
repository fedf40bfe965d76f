"""Forms parse and type-check input; the services decide what is allowed and save it."""

from __future__ import annotations

from typing import Any

from django import forms
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator
from django.db.models import QuerySet
from django.urls import reverse_lazy
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from training.config import ConfigError, RunConfig
from webapp import services, trust
from webapp.models import SPECIALIZATION_CHOICES, Agent, Dataset, ModelSource, Team, Topology
from webapp.services import RUN_OVERRIDES, environment_names


def _environment_field(**kwargs: Any) -> forms.ChoiceField:
    """Installed environments; changing it refreshes the roles/fields hint (htmx)."""
    widget = forms.Select(attrs={
        "hx-get": reverse_lazy("environment_hint"), "hx-target": "#env-hint", "hx-swap": "outerHTML", "hx-trigger": "change",
    })
    return forms.ChoiceField(choices=lambda: [("", "— pick an environment —")] + [(n, n) for n in environment_names()], widget=widget, **kwargs)


class ModelSourceForm(forms.ModelForm):
    class Meta:
        model = ModelSource
        fields = ["name", "source", "notes"]
        widgets = {"notes": forms.Textarea(attrs={"rows": 3})}


class ToolsField(forms.CharField):
    """Tool names as a comma-separated line, stored as a JSON list."""

    def prepare_value(self, value: Any) -> Any:
        return ", ".join(value) if isinstance(value, list) else value

    def to_python(self, value: Any) -> list[str]:  # type: ignore[override]
        text = super().to_python(value)
        return [t.strip() for t in text.split(",") if t.strip()]


class AgentForm(forms.ModelForm):
    tools = ToolsField(required=False, help_text="Comma-separated tool names, e.g. python.")

    class Meta:
        model = Agent
        fields = ["name", "role", "instructions", "model_source", "temperature", "max_new_tokens", "tools", "trainable"]
        widgets = {"instructions": forms.Textarea(attrs={"rows": 8})}

    def __init__(self, *args: Any, team: Team, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.fields["model_source"].queryset = ModelSource.objects.filter(team=team)
        self.fields["role"].widget.attrs["list"] = "known-roles"


class OrderedAgentsWidget(forms.Widget):
    """Numbered agent selects sharing one name; their order is the acting order. It shows the
    chosen agents, then empty slots up to `slots` (at least one, for one more), never more slots
    than there are agents to pick: the same count however often the form comes back."""

    def __init__(self, slots: int = 2):
        super().__init__()
        self.slots = slots
        self.choices: list[tuple[str, str]] = []

    def value_from_datadict(self, data: Any, files: Any, name: str) -> list[str]:
        return data.getlist(name) if hasattr(data, "getlist") else list(data.get(name, []))

    def render(self, name: str, value: Any, attrs: dict[str, Any] | None = None, renderer: Any = None) -> SafeString:
        chosen = [str(v) for v in (value or []) if v not in ("", None)]
        empty = min(max(self.slots - len(chosen), 1), max(len(self.choices) - len(chosen), 0))
        slots = chosen + [""] * empty
        rows = []
        for i, current in enumerate(slots, start=1):
            options = format_html_join(
                "", '<option value="{}"{}>{}</option>',
                ((pk, " selected" if pk == current else "", label) for pk, label in [("", "—")] + self.choices),
            )
            rows.append(format_html(
                '<li><span class="pos">{}</span><select name="{}" aria-label="Agent {}">{}</select></li>',
                i, name, i, options,
            ))
        return format_html('<ol class="agent-order" id="id_{}">{}</ol>', name, format_html_join("", "{}", ((r,) for r in rows)))


class OrderedAgentsField(forms.Field):
    widget = OrderedAgentsWidget

    def __init__(self, *, queryset: QuerySet[Agent] | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.queryset = queryset if queryset is not None else Agent.objects.none()

    def set_queryset(self, queryset: QuerySet[Agent]) -> None:
        self.queryset = queryset
        self.widget.choices = [(str(a.pk), f"{a.name} · {a.role} · {a.model_source.name}") for a in queryset.select_related("model_source")]

    def prepare_value(self, value: Any) -> Any:
        return [a.pk if isinstance(a, Agent) else a for a in (value or [])]

    def clean(self, value: Any) -> list[Agent]:
        ids = [v for v in (value or []) if v not in ("", None)]
        if not ids:
            raise ValidationError("Add at least one agent.")
        try:
            by_id = self.queryset.in_bulk([int(v) for v in ids])
        except ValueError:
            raise ValidationError("Pick agents from the list.") from None
        if len(by_id) != len(set(ids)):
            raise ValidationError("Pick agents from the list.")
        return [by_id[int(v)] for v in ids]


class BoundedJSONField(forms.JSONField):
    """Django's JSONField, parsing through the trust boundary (bounded size and depth; deep
    nesting or a huge number is a form error, not a server error)."""

    def to_python(self, value: Any) -> Any:
        if self.disabled or value in self.empty_values or not isinstance(value, str):
            return super().to_python(value)
        try:
            return trust.json_load(value, field="value")
        except ConfigError as exc:
            raise ValidationError(exc.message) from None

    def bound_data(self, data: Any, initial: Any) -> Any:
        if self.disabled:
            return initial
        if data is None:
            return None
        try:
            return trust.json_load(data, field="value")
        except ConfigError:
            return forms.fields.InvalidJSONInput(data)


def _env_args(value: Any) -> dict[str, Any]:
    value = value or {}
    if not isinstance(value, dict):
        raise ValidationError('Give a JSON object, e.g. {"level": 2}.')
    try:
        trust.check_env_args(value, field="env_args")
    except ConfigError as exc:
        raise ValidationError(f"{exc.field}: {exc.message}" if exc.field != "env_args" else exc.message) from None
    return value


class TopologyForm(forms.ModelForm):
    environment = _environment_field()
    agents = OrderedAgentsField(help_text="In acting order; each agent's role must exist in the environment.")
    env_args = BoundedJSONField(required=False, initial=dict, widget=forms.TextInput,
                               help_text='Environment arguments as JSON, e.g. {"level": 2}.')

    class Meta:
        model = Topology
        fields = ["name", "environment", "env_args", "specialization", "max_turns"]

    def __init__(self, *args: Any, team: Team, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.team = team
        agents_field = self.fields["agents"]
        assert isinstance(agents_field, OrderedAgentsField)
        agents_field.set_queryset(Agent.objects.filter(team=team))
        if self.instance.pk and not self.is_bound:
            self.initial["agents"] = [a.pk for a in self.instance.ordered_agents()]

    def clean_env_args(self) -> dict[str, Any]:
        return _env_args(self.cleaned_data.get("env_args"))

    def clean(self) -> dict[str, Any]:
        """Whether the agents fit the environment and the specialization, with the other field
        errors (not after them): `services.topology_problems`, which saving checks again."""
        data = super().clean() or {}
        if data.get("environment") and "agents" in data and "env_args" in data:
            draft = Topology(team=self.team, environment=data["environment"], env_args=data["env_args"],
                             specialization=data.get("specialization") or "", max_turns=data.get("max_turns") or 1)
            for field, messages in services.topology_problems(topology=draft, agents=data["agents"]).items():
                for message in messages:
                    self.add_error(field if field in self.fields else None, message)
        return data


class DatasetUploadForm(forms.Form):
    name = forms.CharField(max_length=100)
    environment = _environment_field(help_text="Rows must have the fields this environment needs.")
    file = forms.FileField(help_text="JSONL (one JSON object per line) or CSV with a header row, UTF-8.")
    eval_fraction = forms.FloatField(initial=0.1, min_value=0.0, max_value=0.9, help_text="Share of rows held out for evaluation.")


class DatasetGeneratorForm(forms.ModelForm):
    environment = _environment_field()
    env_args = BoundedJSONField(required=False, initial=dict, widget=forms.TextInput,
                               help_text='Generator arguments as JSON, e.g. {"level": 2}.')

    class Meta:
        model = Dataset
        fields = ["name", "environment", "env_args", "size", "eval_size"]
        labels = {"size": "Training tasks", "eval_size": "Held-out tasks"}

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.fields["size"].required = True
        self.fields["eval_size"].required = True
        for name, most in (("size", 10_000_000), ("eval_size", 1_000_000)):  # the engine's data.train_size/eval_size bounds
            self.fields[name].validators.append(MaxValueValidator(most))
            self.fields[name].widget.attrs["max"] = most
        if not self.instance.pk:
            self.initial.setdefault("size", 256)
            self.initial.setdefault("eval_size", 100)

    def clean_env_args(self) -> dict[str, Any]:
        return _env_args(self.cleaned_data.get("env_args"))


class DatasetUploadEditForm(forms.ModelForm):
    class Meta:
        model = Dataset
        fields = ["name", "eval_fraction"]


_DEFAULTS = RunConfig()


class TopologyChoiceField(forms.ModelChoiceField):
    def label_from_instance(self, obj: Topology) -> str:  # type: ignore[override]
        return f"{obj.name} ({obj.environment}, {obj.specialization})"


class DatasetChoiceField(forms.ModelChoiceField):
    def label_from_instance(self, obj: Dataset) -> str:  # type: ignore[override]
        train, held = obj.split
        return f"{obj.name} ({obj.environment}, {train}+{held} tasks)"


def _default(dotted: str) -> str:
    """The engine default of a dotted RunConfig field, as the form shows it (a placeholder)."""
    section, key = dotted.split(".")
    return f"{getattr(getattr(_DEFAULTS, section), key):g}"


def _hyper(field: type[forms.Field], dotted: str, *, placeholder: str | None = None, **kwargs: Any) -> forms.Field:
    """A hyperparameter field: empty by default, its placeholder saying what empty means."""
    widget = forms.TextInput if field is forms.FloatField else forms.NumberInput
    attrs = {"placeholder": placeholder or _default(dotted), "inputmode": "decimal" if field is forms.FloatField else "numeric"}
    return field(required=False, widget=widget(attrs=attrs), **kwargs)


class RunForm(forms.Form):
    """Topology, dataset, the main hyperparameters (empty: the default its placeholder shows) and
    advanced YAML. Every problem is reported at once, next to the field it concerns."""

    name = forms.CharField(max_length=200, required=False, help_text="Defaults to topology · dataset.")
    topology = TopologyChoiceField(queryset=Topology.objects.none())
    dataset = DatasetChoiceField(queryset=Dataset.objects.none())
    specialization = forms.ChoiceField(required=False, choices=[("", "as in the topology")] + SPECIALIZATION_CHOICES)
    steps = _hyper(forms.IntegerField, "optim.steps", help_text="Training steps.")
    k = _hyper(forms.IntegerField, "grpo.k", label="K (group size)", help_text="Candidates per (task, turn, agent).")
    tasks_per_step = _hyper(forms.IntegerField, "optim.tasks_per_step", min_value=1,
                            error_messages={"min_value": "At least 1 task per step (optim.tasks_per_step)."},
                            help_text="Tasks rolled out per step.")
    lr = _hyper(forms.FloatField, "optim.lr", placeholder="1e-4 or 1e-5", label="Learning rate",
                help_text="Empty: 1e-4 for LoRA adapters, 1e-5 for fine-tuning whole models (single, prompt, full).")
    lora_r = _hyper(forms.IntegerField, "lora.r", label="LoRA r", help_text="Adapter rank (lora only).")
    max_new_tokens = _hyper(forms.IntegerField, "generation.max_new_tokens", help_text="Longest completion per turn.")
    temperature = _hyper(forms.FloatField, "generation.temperature", help_text="Sampling temperature while training.")
    beta = _hyper(forms.FloatField, "grpo.beta", label="Beta (KL)", help_text="Weight of the KL penalty; 0 turns it off.")
    eval_every = _hyper(forms.IntegerField, "eval.every", help_text="Steps between held-out evaluations; 0 disables.")
    gpus = _hyper(forms.IntegerField, "resources.gpus", label="GPUs",
                  help_text="GPUs on the worker's host; more than 1 trains data-parallel, one process per GPU.")
    advanced_yaml = forms.CharField(
        required=False, label="Advanced YAML", max_length=trust.MAX_CONFIG_BYTES,
        widget=forms.Textarea(attrs={"rows": 6, "spellcheck": "false", "placeholder": "grpo:\n  alpha: 0.5\nseed: 1"}),
        help_text="Any RunConfig fields, merged on top of everything above.",
    )

    def __init__(self, *args: Any, team: Team, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.fields["topology"].queryset = Topology.objects.filter(team=team)  # type: ignore[attr-defined]
        self.fields["dataset"].queryset = Dataset.objects.filter(team=team, status=Dataset.Status.VALID)  # type: ignore[attr-defined]

    def overrides(self) -> dict[str, Any]:
        """The RunConfig fields this form sets (`{"optim.lr": 1e-4}`); empty fields set nothing."""
        values = {dotted: self.cleaned_data.get(name) for name, dotted in RUN_OVERRIDES.items()}
        values["topology.specialization"] = self.cleaned_data.get("specialization") or None
        return values

    def run_name(self) -> str:
        return self.cleaned_data.get("name") or f"{self.cleaned_data['topology'].name} · {self.cleaned_data['dataset'].name}"

    def add_config_error(self, exc: ConfigError, source: str | None = None) -> None:
        """Show an engine error next to the field it concerns, in words: at the form field that
        caused it (`source`: a dotted override, or "yaml"), else the field it names."""
        field = {dotted: name for name, dotted in RUN_OVERRIDES.items()}.get(source or "") or (
            "advanced_yaml" if source == "yaml" else self.field_for(exc.field))
        if exc.field == "yaml":
            message = exc.message[:1].upper() + exc.message[1:]
        elif field != "advanced_yaml" and RUN_OVERRIDES.get(field) == exc.field:
            message = f"{exc.message[:1].upper()}{exc.message[1:].rstrip('.')} ({exc.field})."
        else:
            message = f"{exc.field}: {exc.message}"
        self.add_error(field, message)

    def field_for(self, dotted: str) -> str:
        if dotted == "yaml" or _yaml_sets(self.cleaned_data.get("advanced_yaml", ""), dotted):
            return "advanced_yaml"
        for name, target in RUN_OVERRIDES.items():
            if dotted == target:
                return name
        if dotted.startswith(("topology", "model")):
            return "topology"
        if dotted.startswith("data"):
            return "dataset"
        return "advanced_yaml"


def _yaml_sets(text: str, dotted: str) -> bool:
    """Whether the advanced YAML sets this dotted field (so its error belongs at the YAML box)."""
    try:
        node: Any = trust.yaml_load(text or "")
    except ConfigError:
        return False
    for part in dotted.split("."):
        if not isinstance(node, dict) or part.split("[")[0] not in node:
            return False
        node = node[part.split("[")[0]]
    return True
