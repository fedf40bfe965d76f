"""The new-run form: topology, dataset, the main hyperparameters and advanced YAML."""

from __future__ import annotations

from typing import Any

from django import forms

from training.config import ConfigError, RunConfig
from webapp.core import trust
from webapp.models import SPECIALIZATION_HELP, SPECIALIZATION_SHORT_CHOICES, Checkpoint, Dataset, Team, Topology
from webapp.runs import selectors
from webapp.runs.services import ALGORITHM_FIELDS, RUN_OVERRIDES, run_source_overrides

_DEFAULTS = RunConfig()


class TopologyChoiceField(forms.ModelChoiceField):
    def label_from_instance(self, obj: Topology) -> str:  # type: ignore[override]
        return f"{obj.name} ({obj.environment}, {obj.specialization})"


class DatasetChoiceField(forms.ModelChoiceField):
    def label_from_instance(self, obj: Dataset) -> str:  # type: ignore[override]
        train, held = obj.split
        return f"{obj.name} ({obj.environment}, {train}+{held} tasks)"


class CheckpointChoiceField(forms.ModelChoiceField):
    def label_from_instance(self, obj: Checkpoint) -> str:  # type: ignore[override]
        return f"run #{obj.run_id} {obj.run.name} · step {obj.step}"


def agent_mapping(text: str) -> dict[str, str]:
    """`solver=writer, critic=shared` as {policy: source folder}; ValueError naming a bad pair."""
    out: dict[str, str] = {}
    for pair in filter(None, (p.strip() for p in text.replace("\n", ",").split(","))):
        mine, eq, theirs = pair.partition("=")
        if not eq or not mine.strip() or not theirs.strip():
            raise ValueError(f"{pair!r} is not policy=folder (like solver=writer, or solver=shared)")
        out[mine.strip()] = theirs.strip()
    return out


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

    name = forms.CharField(max_length=200, required=False, help_text="Defaults to topology · dataset (topology · SFT on conversations).")
    topology = TopologyChoiceField(queryset=Topology.objects.none())
    dataset = DatasetChoiceField(queryset=Dataset.objects.none())
    algorithm = forms.ChoiceField(initial="grpo", required=False, choices=[("grpo", "GRPO (own rollouts)"), ("sft", "SFT (conversations)")],
                                  help_text="GRPO: the agents learn from their own rollouts. SFT: each agent learns its own assistant turns "
                                            "of an uploaded conversations dataset; the dataset above gives the held-out tasks.")
    conversations = forms.ModelChoiceField(queryset=Dataset.objects.none(), required=False, label="Conversations (SFT)",
                                           help_text="An uploaded conversations dataset; used when the algorithm is SFT.")
    init_checkpoint = CheckpointChoiceField(queryset=Checkpoint.objects.none(), required=False, label="Start from the weights of",
                                            empty_label="the base model (a cold start)",
                                            help_text="A finished run's checkpoint: each policy loads its folder (model.init_from); "
                                                      "optimizer and data order start fresh.")
    init_agents = forms.CharField(required=False, max_length=2000, label="Agent mapping",
                                  widget=forms.TextInput(attrs={"placeholder": "solver=writer, critic=shared"}),
                                  help_text="Which folder of that checkpoint each policy loads, where the names differ; "
                                            "empty: each loads the folder of its own name (an agent, or `shared`).")
    specialization = forms.ChoiceField(required=False, choices=[("", "as in the topology")] + SPECIALIZATION_SHORT_CHOICES,
                                       help_text=SPECIALIZATION_HELP)
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
    sft_batch_size = _hyper(forms.IntegerField, "sft.batch_size", label="Batch size (SFT)", min_value=1,
                            help_text="Conversations per step for each trained policy.")
    sft_max_length = _hyper(forms.IntegerField, "sft.max_length", label="Max length (SFT)", min_value=1,
                            help_text="Most tokens of one conversation; longer ones are cut at the end.")
    gpus = _hyper(forms.IntegerField, "resources.gpus", label="GPUs",
                  help_text="GPUs on the worker's host; more than 1 trains data-parallel, one process per GPU.")
    hosts = _hyper(forms.IntegerField, "resources.hosts", label="Hosts",
                   help_text="Hosts of the Ray cluster the run spans, GPUs on each; more than 1 needs TROUPE_RAY_ADDRESS.")
    advanced_yaml = forms.CharField(
        required=False, label="Advanced YAML", max_length=trust.MAX_CONFIG_BYTES,
        widget=forms.Textarea(attrs={"rows": 6, "spellcheck": "false", "placeholder": "grpo:\n  alpha: 0.5\nseed: 1"}),
        help_text="Any RunConfig fields, merged on top of everything above.",
    )

    def __init__(self, *args: Any, team: Team, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.team = team
        self._yaml_tree: Any = None
        self.fields["topology"].queryset = Topology.objects.filter(team=team)  # type: ignore[attr-defined]
        valid = Dataset.objects.filter(team=team, status=Dataset.Status.VALID)
        self.fields["dataset"].queryset = valid.exclude(kind=Dataset.Kind.CHATS)  # type: ignore[attr-defined]
        self.fields["conversations"].queryset = valid.filter(kind=Dataset.Kind.CHATS)  # type: ignore[attr-defined]
        self.fields["init_checkpoint"].queryset = selectors.startable_checkpoints(team=team)  # type: ignore[attr-defined]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("algorithm") == "sft" and not data.get("conversations"):
            self.add_error("conversations", "An SFT run learns from a conversations dataset: pick one (upload it under Datasets).")
        try:
            data["init_agents"] = agent_mapping(data.get("init_agents") or "")
        except ValueError as exc:
            self.add_error("init_agents", f"{str(exc)[:1].upper()}{str(exc)[1:]}.")
        else:
            if data["init_agents"] and not data.get("init_checkpoint"):
                self.add_error("init_agents", "Maps policies to a checkpoint's folders: pick the checkpoint to start from too.")
        return data

    def overrides(self) -> dict[str, Any]:
        """The RunConfig fields this form sets (`{"optim.lr": 1e-4}`); empty fields set nothing."""
        sft = self.cleaned_data.get("algorithm") == "sft"
        other = ALGORITHM_FIELDS["grpo" if sft else "sft"]  # hidden on the page: whatever they hold sets nothing
        values = {dotted: self.cleaned_data.get(name) for name, dotted in RUN_OVERRIDES.items() if name not in other}
        values["topology.specialization"] = self.cleaned_data.get("specialization") or None
        checkpoint, agents = self.cleaned_data.get("init_checkpoint"), self.cleaned_data.get("init_agents")
        return {**values, **run_source_overrides(team=self.team, conversations=self.cleaned_data.get("conversations") if sft else None,
                                                 start_from=checkpoint, agents=agents if checkpoint and isinstance(agents, dict) else None)}

    def run_name(self) -> str:
        data = self.cleaned_data
        if data.get("name"):
            return str(data["name"])
        if data.get("algorithm") == "sft" and data.get("conversations"):
            return f"{data['topology'].name} · SFT on {data['conversations'].name}"
        return f"{data['topology'].name} · {data['dataset'].name}"

    def algorithm_fields(self) -> dict[str, str]:
        """For the page: the fields each algorithm alone reads (space-separated, run-form.js hides the others)."""
        return {algorithm: " ".join(names) for algorithm, names in ALGORITHM_FIELDS.items()}

    def add_config_error(self, exc: ConfigError, source: str | None = None) -> None:
        """Show an engine error next to the field it concerns, in words: at the form field `source`
        names (a dotted override, or "yaml") when given, else at the field its dotted path names:
        the advanced YAML box when the YAML sets that field, the form field that sets it, or the
        topology or dataset it comes from."""
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
        if dotted == "yaml" or _yaml_sets(self._advanced_tree(), dotted):
            return "advanced_yaml"
        for name, target in RUN_OVERRIDES.items():
            if dotted == target:
                return name
        if dotted.startswith("model.init_from.agents"):
            return "init_agents"
        if dotted.startswith("model.init_from"):
            return "init_checkpoint"
        if dotted.startswith(("topology", "model")):
            return "topology"
        if dotted.startswith("data"):
            return "dataset"
        if dotted == "algorithm":
            return "algorithm"
        if dotted.startswith("sft."):
            return "conversations"
        return "advanced_yaml"

    def _advanced_tree(self) -> Any:
        """The advanced YAML, parsed once (None when it does not parse)."""
        if self._yaml_tree is None:
            try:
                self._yaml_tree = trust.yaml_load(self.cleaned_data.get("advanced_yaml", "") or "") or {}
            except ConfigError:
                self._yaml_tree = {}
        return self._yaml_tree


def _yaml_sets(tree: Any, dotted: str) -> bool:
    """Whether the advanced YAML's tree sets this dotted field (`grpo.kk`,
    `topology.agents[1].tools[0]`), so that its error belongs at the YAML box."""
    node = tree
    for part in dotted.split("."):
        key, *indices = part.replace("]", "").split("[")
        if not isinstance(node, dict) or key not in node:
            return False
        node = node[key]
        for index in indices:
            if not (isinstance(node, list) and index.isascii() and index.isdigit() and int(index) < len(node)):
                return False
            node = node[int(index)]
    return True


class WarmStartForm(forms.Form):
    """"Warm start from this run": which of the run's episodes to learn from, and the SFT run's
    main settings (`webapp.runs.warmstart.warm_start_launch`)."""

    threshold = forms.FloatField(required=False, label="Team reward at least", widget=forms.TextInput(attrs={"placeholder": "succeeded", "inputmode": "decimal"}),
                                 help_text="Empty: the episodes that succeeded. A number from 0 to 1: the episodes whose team reward reaches it.")
    start_from = forms.ChoiceField(required=False, label="Start from",
                                   help_text="The weights the run itself started from (its base model, or its own warm start), "
                                             "or one of its checkpoints.")
    steps = forms.IntegerField(min_value=1, max_value=100_000, initial=20, help_text="SFT steps.")
    batch_size = forms.IntegerField(min_value=1, max_value=4096, initial=8, help_text="Examples per step for each trained policy (sft.batch_size).")
    lr = forms.FloatField(required=False, label="Learning rate", widget=forms.TextInput(attrs={"placeholder": "as the run", "inputmode": "decimal"}),
                          help_text="Empty: the run's own.")
    name = forms.CharField(max_length=200, required=False, help_text="Defaults to the run's name · SFT on its episodes.")

    def __init__(self, *args: Any, checkpoints: list[Any], **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.checkpoints = {str(c.pk): c for c in checkpoints}
        self.fields["start_from"].choices = [("", "what the run started from")] + [(key, f"checkpoint of step {c.step}") for key, c in self.checkpoints.items()]  # type: ignore[attr-defined]

    def clean_start_from(self) -> Any:
        return self.checkpoints.get(self.cleaned_data.get("start_from") or "")
