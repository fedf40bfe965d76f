"""Warm start from a run's own episodes (rejection-sampling fine-tuning, expert iteration): the
candidates that continued in the run's best episodes become an SFT set, per agent, and an SFT run
learns from it.

A stored rollout keeps, for each turn, the prompt as the agent's chat template rendered it and each
candidate's text (with a tool-calling turn's segments and the calls' results), not chat messages.
So each example is a prompt-completion line (`training.conversations`): the turn's prompt, and the
chosen candidate's text, or its segments with the tool results between them. The SFT engine learns
the completion's own text and its end of turn; the prompt and the tool results are context
(`training.sft.encode_completion`).

`warm_start_set` reads the set (what the page previews); `warm_start_launch` stores it as one of the
team's conversations datasets and queues the SFT run on it, or neither.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import transaction

from training.conversations import episode_rows
from webapp.catalog.conversations import conversations_upload
from webapp.catalog.services.names import free_name
from webapp.models import Checkpoint, Dataset, Run
from webapp.runs import services

THRESHOLD_RANGE = (0.0, 1.0)
"""A team reward threshold lies here: every built-in environment's team reward runs from 0 to 1."""
PREVIEW_EXAMPLES = 2
"""Examples shown per agent."""
PREVIEW_CHARS = 400


@dataclass
class EpisodeSet:
    """What a warm start learns from: one prompt-completion row per chosen candidate (`rows`)."""

    run: Run
    threshold: float | None
    """None: the episodes that succeeded; else those with a team reward at least this."""
    stored: int = 0
    """Episodes the run stored."""
    episodes: int = 0
    """Of them, those that qualify."""
    rows: list[dict[str, Any]] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    """Agent -> its examples."""
    duplicates: int = 0
    """Chosen candidates left out because an identical (agent, prompt, completion) came before."""
    left_out: int = 0
    """Rows past the upload limits (TROUPE_UPLOAD_MAX_ROWS, TROUPE_UPLOAD_MAX_BYTES): the oldest episodes'."""
    truncated: int = 0
    """Chosen candidates left out because the length cap cut them (`training.conversations.EpisodeRows`)."""

    @property
    def rule(self) -> str:
        return "succeeded" if self.threshold is None else f"team reward ≥ {self.threshold:g}"

    def samples(self) -> dict[str, list[dict[str, str]]]:
        """A few examples per agent, shortened for the page: the prompt's end and the completion."""
        out: dict[str, list[dict[str, str]]] = {}
        for row in self.rows:
            shown = out.setdefault(row["agent"], [])
            if len(shown) < PREVIEW_EXAMPLES:
                completion = row["completion"] if isinstance(row["completion"], str) else "\n".join(
                    m["content"] if m["role"] == "assistant" else f"[{m.get('name') or 'tool'} result: {m['content']}]"
                    for m in row["completion"])
                shown.append({"prompt": _tail(row["prompt"]), "completion": _head(completion)})
        return out

    def jsonl(self) -> bytes:
        return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in self.rows).encode()


def warm_start_set(*, run: Run, threshold: float | None = None) -> EpisodeSet:
    """The SFT set of `run`'s stored episodes that succeeded (or whose team reward is at least
    `threshold`): for each turn of each, the candidate the episode continued from, as a row for the
    agent that wrote it; identical rows once. ValidationError naming what is wrong: a run still
    running, a threshold out of range, a run that stored no episodes (an SFT run stores none), or no
    episode that qualifies."""
    if run.is_active:
        raise ValidationError(f"Run #{run.pk} is still {run.status}: warm start from it once it has finished.")
    low, high = THRESHOLD_RANGE
    if threshold is not None and not low <= threshold <= high:
        raise ValidationError({"threshold": f"The team reward threshold must lie between {low:g} and {high:g}; it is {threshold:g}."})
    stored = run.rollouts.all()
    out = EpisodeSet(run=run, threshold=threshold, stored=stored.count())
    if not out.stored:
        raise ValidationError(f"Run #{run.pk} stored no episodes to learn from (only a GRPO run's training steps store them).")
    chosen = stored.filter(success=True) if threshold is None else stored.filter(team_reward__gte=threshold)
    seen: set[str] = set()
    size = 0
    for data in chosen.order_by("-step", "episode").values_list("data", flat=True).iterator():
        out.episodes += 1
        turns = episode_rows(data)
        out.truncated += turns.truncated
        for row in turns.rows:
            key = json.dumps(row, sort_keys=True)
            if key in seen:
                out.duplicates += 1
                continue
            seen.add(key)
            line = len(json.dumps(row, ensure_ascii=False).encode()) + 1
            if len(out.rows) >= settings.TROUPE_UPLOAD_MAX_ROWS or size + line > settings.TROUPE_UPLOAD_MAX_BYTES:
                out.left_out += 1  # the newest episodes come first, so a long run keeps its latest
                continue
            size += line
            out.rows.append(row)
            out.counts[row["agent"]] = out.counts.get(row["agent"], 0) + 1
    if not out.rows:
        best = stored.order_by("-team_reward").values_list("team_reward", flat=True).first()
        why = (f"none of its {out.stored} stored episodes succeeded" if threshold is None else
               f"none of its {out.stored} stored episodes has a team reward ≥ {threshold:g} (the best has {best:g})")
        raise ValidationError({"threshold": f"No episode of run #{run.pk} qualifies: {why}. "
                                            + ("Set a team reward threshold instead." if threshold is None else "Lower the threshold.")})
    return out


def _tail(text: str) -> str:
    return text if len(text) <= PREVIEW_CHARS else "…" + text[-(PREVIEW_CHARS - 1):]


def _head(text: str) -> str:
    return text if len(text) <= PREVIEW_CHARS else text[: PREVIEW_CHARS - 1] + "…"


def warm_start_checkpoints(*, run: Run) -> list[Checkpoint]:
    """The run's checkpoints an SFT run may start from (their files still there)."""
    return list(run.checkpoints.kept().order_by("-step"))


def warm_start_launch(
    *, run: Run, user: User | None, threshold: float | None = None, steps: int = 20, batch_size: int = 8, lr: float | None = None,
    start_from: Checkpoint | None = None, name: str = "",
) -> Run:
    """Store `run`'s episode set (`warm_start_set`) as one of the team's conversations datasets and
    queue an SFT run on it: the run's topology, model, data (its held-out tasks) and evaluation,
    learning for `steps` steps of `batch_size` examples per policy, from the weights the run started
    from (its base model, or its own `model.init_from`) or from `start_from` (one of its checkpoints). Either the dataset and the run are both saved, or
    neither (ValidationError or ConfigError naming the problem).

    While a warm start of `run` with the same settings is queued or running, that run is returned
    instead, also to a request at the same moment (a double click, two tabs): the lookup, the
    dataset and the run are made under the source run's row lock (SQLite: the write lock taken at
    BEGIN), as Resume does."""
    episodes = warm_start_set(run=run, threshold=threshold)
    if start_from is not None and (start_from.run_id != run.pk or start_from.deleted is not None):
        raise ValidationError({"start_from": f"Start from one of run #{run.pk}'s kept checkpoints."})
    tree = run.to_config().to_dict()
    tree.update(algorithm="sft", grpo={}, sft={"batch_size": batch_size})
    tree["data"] = {k: v for k, v in tree["data"].items() if k not in ("reward_fn", "reward_fns", "reward_weights")}
    tree["resources"] = {**tree.get("resources", {}), "gpus": 1, "hosts": 1}
    tree["checkpoint"] = {**tree.get("checkpoint", {}), "resume_from": None}
    tree["optim"] = {**tree["optim"], "steps": steps, **({"lr": lr} if lr is not None else {})}
    if start_from is not None:  # else the weights the run itself started from (its base, or its own warm start)
        tree["model"]["init_from"] = {"run": start_from.path, "step": start_from.step}
    label = f"run #{run.pk} episodes ({episodes.rule})"
    run_name = (name or f"{run.name} · SFT on {label}")[:200]
    stored: Dataset | None = None
    try:
        with transaction.atomic():
            Run.objects.select_for_update().filter(pk=run.pk).first()
            pending = _pending_warm_start(run, label=label, name=run_name, tree=tree, lr=lr)
            if pending is not None:
                return pending
            dataset_name = free_name(Dataset, run.team, label, max_length=100,
                                     suffixes=("" if i == 1 else f" ({i})" for i in range(1, 1000)))
            stored = conversations_upload(team=run.team, name=dataset_name, environment=run.environment or run.to_config().topology.environment,
                                          upload=SimpleUploadedFile(f"run-{run.pk}-episodes.jsonl", episodes.jsonl()), actor=user)
            tree["sft"]["path"] = str(stored.path)
            config = services.run_config_build(team=run.team, tree=tree, name=run_name)
            return services.run_create(team=run.team, user=user, name=config.name, config=config, topology=run.topology, dataset=run.dataset)
    except BaseException:
        if stored is not None and stored.path is not None:
            stored.path.unlink(missing_ok=True)
        raise


def _pending_warm_start(run: Run, *, label: str, name: str, tree: dict[str, Any], lr: float | None) -> Run | None:
    """A queued or running warm start of `run` asked with the same settings: an episode set of the
    same rule (its dataset's name starts with `label`), the same run name, steps, batch size,
    learning rate (when one is asked) and starting weights."""
    sets = {str(d.path) for d in Dataset.objects.filter(team=run.team, kind=Dataset.Kind.CHATS, name__startswith=label) if d.path}
    init = (tree["model"].get("init_from") or {}).get("run")
    for candidate in Run.objects.filter(team=run.team, algorithm="sft", name=name, status__in=Run.ACTIVE).order_by("created", "id"):
        config = candidate.to_config()
        if str(config.sft.path) not in sets:
            continue
        same = (config.optim.steps == tree["optim"]["steps"] and config.sft.batch_size == tree["sft"]["batch_size"]
                and (config.model.init_from.run if config.model.init_from is not None else None) == init)
        if same and (lr is None or config.optim.lr == lr):
            return candidate
    return None
