"""Forms of the catalog: model sources, agents, topologies (agents in acting order) and datasets."""

from __future__ import annotations

from typing import Any

from django import forms
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator
from django.db.models import QuerySet
from django.urls import reverse_lazy
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from agents.tools import ToolError, load_tool, tool_names
from training.config import ConfigError
from webapp.catalog import services
from webapp.catalog.environments import environment_names
from webapp.core import trust
from webapp.core.values import ID_MAX
from webapp.models import SPECIALIZATION_HELP, SPECIALIZATION_SHORT_CHOICES, Agent, Dataset, Grader, ModelSource, Task, Team, Topology


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
    tools = ToolsField(required=False)

    class Meta:
        model = Agent
        fields = ["name", "role", "instructions", "model_source", "temperature", "max_new_tokens", "tools", "trainable"]
        widgets = {"instructions": forms.Textarea(attrs={"rows": 8})}

    def __init__(self, *args: Any, team: Team, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.fields["model_source"].queryset = ModelSource.objects.filter(team=team)
        self.fields["role"].widget.attrs["list"] = "known-roles"
        self.fields["tools"].help_text = (f"Tools it may call during its turn, comma-separated: {', '.join(tool_names())}. "
                                          "Leave empty for none (an environment's own code running, as math_tool's, needs none).")

    def clean_tools(self) -> list[str]:
        names = self.cleaned_data.get("tools") or []
        problems = []
        for name in names:
            try:
                load_tool(name)
            except ToolError as exc:
                problems.append(str(exc))
        if len(set(names)) != len(names):
            problems.append("Each tool once.")
        if problems:
            raise ValidationError(problems)
        return names


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
            wanted = [int(v) for v in ids]
        except (TypeError, ValueError):
            raise ValidationError("Pick agents from the list.") from None
        if not all(0 < pk <= ID_MAX for pk in wanted):  # a database integer; a larger one is no agent (and overflows SQLite)
            raise ValidationError("Pick agents from the list.")
        by_id = self.queryset.in_bulk(wanted)
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
        specialization = self.fields["specialization"]
        assert isinstance(specialization, forms.ChoiceField)
        specialization.choices, specialization.help_text = SPECIALIZATION_SHORT_CHOICES, SPECIALIZATION_HELP  # labels that fit the box
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


class ConversationsUploadForm(forms.Form):
    name = forms.CharField(max_length=100)
    environment = _environment_field(help_text="The environment of the topologies these conversations train (its held-out tasks evaluate the run).")
    file = forms.FileField(help_text="JSONL of conversations (TRL's `messages` format), UTF-8.")


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


# == graders and tasks ============================================================================


class YamlField(forms.CharField):
    """A YAML (or JSON) value in a text box, parsed through the trust boundary (`trust.yaml_load`,
    `trust.check_tree`); `kind` is the type it must be (dict or list)."""

    def __init__(self, *, kind: type, **kwargs: Any):
        kwargs.setdefault("widget", forms.Textarea(attrs={"rows": 6, "class": "mono", "spellcheck": "false"}))
        kwargs.setdefault("max_length", trust.MAX_CONFIG_BYTES)
        super().__init__(strip=False, **kwargs)
        self.kind = kind

    def prepare_value(self, value: Any) -> Any:
        if isinstance(value, (dict, list)):
            import yaml

            return "" if not value else yaml.safe_dump(value, sort_keys=False, allow_unicode=True)
        return value

    def to_python(self, value: Any) -> Any:
        text = super().to_python(value)
        if not text or not text.strip():
            return self.kind()
        try:
            parsed = trust.yaml_load(text, field="yaml")
            trust.check_tree(parsed, field="yaml", max_depth=trust.MAX_TASK_ARGS_DEPTH)
        except ConfigError as exc:
            raise ValidationError(exc.message) from None
        if parsed is None:
            return self.kind()
        if not isinstance(parsed, self.kind):
            raise ValidationError(f"Give a YAML {'mapping (key: value lines)' if self.kind is dict else 'list (- item lines)'}, "
                                  f"not {type(parsed).__name__}.")
        return parsed


GRADER_SETTINGS_HELP = (
    "The kind's settings, as YAML. exact / normalized: column (default answer), extract (true: the Answer: line), "
    "ignore_punctuation (normalized). regex: pattern, fullmatch. number: column, tolerance, relative. "
    'json_schema: schema (a JSON Schema). python: timeout_s (default 2, at most 10). combination: weights (grader: weight).'
)


class GraderForm(forms.ModelForm):
    settings = YamlField(kind=dict, required=False, help_text=GRADER_SETTINGS_HELP,
                         widget=forms.Textarea(attrs={"rows": 4, "class": "mono", "spellcheck": "false"}))
    try_dataset = forms.ModelChoiceField(queryset=Dataset.objects.none(), required=False, label="Try on the first rows of",
                                         help_text="Saving tries it there too, and refuses a grader that fails.")
    try_answer = forms.CharField(required=False, label="Answer to try", widget=forms.Textarea(attrs={"rows": 2}),
                                 help_text="Graded against each of those rows, as a model's completion would be.")

    class Meta:
        model = Grader
        fields = ["name", "kind", "description", "code", "settings"]
        widgets = {"code": forms.Textarea(attrs={"rows": 10, "class": "mono", "spellcheck": "false",
                                                 "placeholder": "def grade(completion, row):\n    return 1.0 if row['answer'] in completion else 0.0"})}

    def __init__(self, *args: Any, team: Team, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.team = team
        self.instance.team = team
        code = self.fields["code"]
        assert isinstance(code, forms.CharField)
        code.strip = False  # the code as written (a trailing newline, indentation)
        field = self.fields["try_dataset"]
        assert isinstance(field, forms.ModelChoiceField)
        field.queryset = Dataset.objects.filter(team=team, status=Dataset.Status.VALID).exclude(kind=Dataset.Kind.CHATS)

    def clean_code(self) -> str:
        """The code with the browser's CRLF line ends made LF (what an editor and the sandbox expect)."""
        return str(self.cleaned_data.get("code") or "").replace("\r\n", "\n")


class TaskForm(forms.ModelForm):
    roles = YamlField(kind=list, help_text=(
        "In turn order, as YAML: each role's name, its prompt over the row's columns ({question}; {{ and }} for braces), "
        "sees_turns (true, false, or a list of roles whose turns it sees) and its grader."),
        widget=forms.Textarea(attrs={"rows": 9, "class": "mono", "spellcheck": "false",
                                     "placeholder": "- name: answerer\n  prompt: \"Question: {question}\"\n  grader: correct\n"
                                                    "- name: checker\n  prompt: \"Is this right? {question}\"\n  sees_turns: true\n"
                                                    "  grader: verdict"}))
    team_grader = forms.ChoiceField(required=False, label="Team reward grader")
    try_answers = YamlField(kind=dict, required=False, label="Answers to try (role: answer)",
                            help_text="Graded on each of the dataset's first rows; saving refuses a grader that fails on them.",
                            widget=forms.Textarea(attrs={"rows": 3, "class": "mono", "spellcheck": "false",
                                                         "placeholder": "answerer: \"Answer: 4\"\nchecker: OK"}))

    class Meta:
        model = Task
        fields = ["name", "description", "dataset", "roles", "team_grader", "team_role", "rounds"]

    def __init__(self, *args: Any, team: Team, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.team = team
        self.instance.team = team
        dataset = self.fields["dataset"]
        assert isinstance(dataset, forms.ModelChoiceField)
        dataset.queryset = Dataset.objects.filter(team=team, status=Dataset.Status.VALID).exclude(kind=Dataset.Kind.CHATS)
        grader = self.fields["team_grader"]
        assert isinstance(grader, forms.ChoiceField)
        grader.choices = [("", "— none —")] + [(n, n) for n in Grader.objects.filter(team=team).values_list("name", flat=True)]

    def clean_try_answers(self) -> dict[str, str]:
        answers = self.cleaned_data.get("try_answers") or {}
        if not all(isinstance(k, str) and isinstance(v, (str, int, float)) for k, v in answers.items()):
            raise ValidationError("Give each role's answer as text: role: answer.")
        return {k: str(v) for k, v in answers.items()}


class TaskTopologyForm(forms.Form):
    model_source = forms.ModelChoiceField(queryset=ModelSource.objects.none(), label="Model")
    specialization = forms.ChoiceField(choices=SPECIALIZATION_SHORT_CHOICES, initial="lora", help_text=SPECIALIZATION_HELP)

    def __init__(self, *args: Any, team: Team, **kwargs: Any):
        super().__init__(*args, **kwargs)
        field = self.fields["model_source"]
        assert isinstance(field, forms.ModelChoiceField)
        field.queryset = ModelSource.objects.filter(team=team)
        field.initial = field.queryset.values_list("pk", flat=True).first()  # the team's first model, picked already
