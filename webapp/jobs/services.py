"""Jobs: model work besides training, done by a GPU worker (the Celery `gpu` queue). Each job is
claim -> call the engine -> record; the engine's functions do the model work:

- `evaluation_*`: evaluate a checkpoint (or the base models) of a run on the held-out split of
  any dataset of the same environment, through `training.evaluation.evaluate_checkpoint`; or an
  ablation of a team run (`webapp.jobs.ablations`), through `training.ablation.evaluate_ablation`.
- `merge_*`: merge one agent's LoRA adapter into its base and keep the result as a standalone
  Hugging Face model folder for download, through `training.export.merge_adapter`.
- `playground_*`: agents (a topology's base models, or a run's checkpoint, and optionally both
  side by side) play one task the user typed, through `training.playground.play`; each turn is
  written to the job row as it is generated, and the page polls the row.

Why a worker and not the web process: models load where the GPUs are (the web image may not
even have torch), inference takes the GPU between runs instead of racing them, and Daphne's
event loop (and Django's single sync thread under ASGI) never waits on a model. The job row is the
state: claimed atomically (`queued` -> `running`), so a redelivered task does nothing. Requests
create the row and enqueue on commit; the `*_execute` functions are what the tasks call, and
tests call them directly.
"""

from __future__ import annotations

import logging
import traceback
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone
from kombu.exceptions import OperationalError

from training.config import ConfigError, RunConfig
from training.events import summary
from training.playground import lane as playground_lane
from training.playground import untrained_label
from webapp.artifacts import files as artifacts
from webapp.catalog import environments
from webapp.catalog import selectors as catalog_selectors
from webapp.core import paths, trust
from webapp.core.enqueue import enqueue, job_task
from webapp.core.values import storable
from webapp.models import Checkpoint, Dataset, Job, JobEpisode, Run, Team, Topology, Worker
from webapp.teams.audit import Verb, audit_record

log = logging.getLogger(__name__)


JOB_LOST_MESSAGE = "worker lost: {worker} stopped while this job was running (killed, or silent for over {limit} s). Start it again."


def job_sweep_lost(*, now: Any = None) -> list[int]:
    """Mark failed every running job whose worker is gone: its worker row says it stopped or has
    been silent for TROUPE_WORKER_LOST_SECONDS (a worker's beat thread writes the row during jobs
    too). Jobs are short and keep no heartbeat of their own; a job claimed by an unnamed worker
    (tests, scripts) is never swept. Returns the ids marked."""
    now = now or timezone.now()
    limit = settings.TROUPE_WORKER_LOST_SECONDS
    alive = [w.hostname for w in Worker.objects.filter(stopped__isnull=True, last_seen__gte=now - timedelta(seconds=limit))]
    marked = []
    for job in Job.objects.filter(status=Job.Status.RUNNING).exclude(worker="").exclude(worker__in=alive).only("pk", "worker"):
        if _fail_lost_jobs(Job.objects.filter(pk=job.pk), worker=job.worker, now=now):
            marked.append(job.pk)
            log.warning("job %s: worker %s lost", job.pk, job.worker)
    return marked


def job_fail_lost(*, worker: str) -> int:
    """A worker came back up under `worker`: the jobs its earlier process left running are lost."""
    return _fail_lost_jobs(Job.objects.all(), worker=worker, now=timezone.now())


def _fail_lost_jobs(jobs: Any, *, worker: str, now: Any) -> int:
    """Mark failed those of `jobs` still running on `worker` (one conditional UPDATE)."""
    return int(jobs.filter(status=Job.Status.RUNNING, worker=worker).update(
        status=Job.Status.FAILED, finished=now, error=JOB_LOST_MESSAGE.format(worker=worker, limit=settings.TROUPE_WORKER_LOST_SECONDS),
    ))


PLAYGROUND_MAX_TOKENS = 1024


PLAYGROUND_FIELD_CHARS = 20_000


# == shared: create, enqueue, claim, finish ==========================================================


AUDIT_VERBS = {Job.Kind.EVALUATE: Verb.LAUNCH, Job.Kind.MERGE: Verb.EXPORT, Job.Kind.PLAYGROUND: Verb.LAUNCH}
AUDIT_PARAMS = ("checkpoint_step", "agent", "dtype", "dataset_name")


def job_create(*, team: Team, user: User | None, kind: str, **fields: Any) -> Job:
    with transaction.atomic():
        job = Job.objects.create(team=team, owner=user, kind=kind, celery_task_id=str(uuid.uuid4()), **fields)
        audit_record(team=team, actor=user, verb=AUDIT_VERBS[Job.Kind(kind)], obj=job,
                     **{k: v for k, v in (job.params or {}).items() if k in AUDIT_PARAMS and v is not None})
        transaction.on_commit(lambda: job_enqueue(job=job))
    return job


def job_enqueue(*, job: Job) -> None:
    """Send the job to its task on the `gpu` queue; a broker that is down leaves it queued."""
    try:
        enqueue(job_task(job.kind), object_id=job.pk, task_id=job.celery_task_id or None)
    except OperationalError as exc:
        log.warning("job %s: could not reach the broker: %s", job.pk, exc)
        Job.objects.filter(pk=job.pk).update(error=f"could not reach the task queue ({exc}); the job stays queued")


def _claim(job_id: int, kind: str, worker: str = "") -> Job | None:
    now = timezone.now()
    claimed = Job.objects.filter(pk=job_id, kind=kind, status=Job.Status.QUEUED).update(
        status=Job.Status.RUNNING, started=now, error="", worker=worker[:200],
    )
    if not claimed:
        log.info("job %s is not queued any more; nothing to do", job_id)
        return None
    return Job.objects.select_related("run", "checkpoint", "dataset", "topology").get(pk=job_id)


def _finish(job: Job, *, status: str, error: str = "", **fields: Any) -> Job:
    Job.objects.filter(pk=job.pk).update(status=status, finished=timezone.now(), error=error[:20_000], **fields)
    job.refresh_from_db()
    return job


def _run_job(job: Job, work: Callable[[Job], dict[str, Any]]) -> Job:
    """Do the work; any failure is the job's outcome (one line in the log; the traceback at debug level)."""
    log.info("job #%s started: %s%s", job.pk, job.get_kind_display().lower(), f" for run #{job.run_id}" if job.run_id else "")
    try:
        fields = work(job)
    except Exception as exc:  # model, data or sandbox failures all end the job, never the worker
        log.warning("job #%s failed: %s: %s", job.pk, type(exc).__name__, exc)
        log.debug("job #%s traceback:\n%s", job.pk, traceback.format_exc())
        return _finish(job, status=Job.Status.FAILED, error=f"{type(exc).__name__}: {exc}")
    log.info("job #%s succeeded", job.pk)
    return _finish(job, status=Job.Status.SUCCEEDED, **fields)


def _checkpoint_path(job: Job) -> str | None:
    """The checkpoint folder a job reads (None: the base models)."""
    if job.checkpoint is None:
        if job.params.get("checkpoint_step") is not None:
            raise FileNotFoundError("the checkpoint was deleted")
        return None
    assert job.run is not None
    return str(artifacts.checkpoint_folder(run=job.run, checkpoint=job.checkpoint))


def _partner_path(job: Job) -> str | None:
    """The partner run's checkpoint folder an `apart` ablation reads (None for any other job)."""
    if job.params.get("partner_checkpoint") is None:
        return None
    checkpoint = Checkpoint.objects.filter(pk=job.params["partner_checkpoint"], run_id=job.params.get("partner_run")).first()
    if checkpoint is None:
        raise FileNotFoundError(f"the partner run #{job.params.get('partner_run')}'s checkpoint was deleted")
    return str(artifacts.checkpoint_folder(run=checkpoint.run, checkpoint=checkpoint))


def _checked_checkpoint(run: Run, checkpoint: Checkpoint | None) -> None:
    if checkpoint is None:
        return
    if checkpoint.run_id != run.pk:
        raise ValidationError({"checkpoint": "Pick one of this run's checkpoints."})
    try:
        artifacts.checkpoint_folder(run=run, checkpoint=checkpoint)
    except artifacts.ArtifactMissing as exc:
        raise ValidationError({"checkpoint": str(exc)}) from None


# == evaluation =======================================================================================


def evaluation_config(*, run: Run, dataset: Dataset) -> RunConfig:
    """The run's config with `data` pointing at `dataset` and every held-out task evaluated."""
    config = run.to_config()
    if dataset.environment != config.topology.environment:
        raise ConfigError("data", f"{dataset.name} is a {dataset.environment} dataset; this run plays {config.topology.environment}")
    env_args, data = catalog_selectors.dataset_config_tree(dataset=dataset)
    tree = config.to_dict()
    tree["topology"]["env_args"] = {**tree["topology"]["env_args"], **env_args}
    tree["data"] = {**tree["data"], **data}
    held_out = data.get("eval_size") or 0
    if not held_out:
        raise ConfigError("data", f"{dataset.name} holds out no tasks for evaluation")
    tree["eval"] = {**tree["eval"], "size": held_out}
    tree["checkpoint"] = {**tree["checkpoint"], "resume_from": None}
    return RunConfig.from_dict(tree)


def evaluation_request(*, run: Run, user: User | None, dataset: Dataset, checkpoint: Checkpoint | None) -> Job:
    """Queue an evaluation of `checkpoint` (None: the base models) on `dataset`'s held-out split.

    While the same evaluation (this run, checkpoint and dataset) is queued or running, that job is
    returned instead, also to a request at the same moment: the lookup and the insert hold the run's
    row lock (SQLite: the write lock taken at BEGIN), so a double click or two tabs make one job."""
    if dataset.team_id != run.team_id:
        raise ValidationError({"dataset": "Pick one of your team's datasets."})
    _checked_checkpoint(run, checkpoint)
    try:
        config = evaluation_config(run=run, dataset=dataset)
    except ConfigError as exc:
        raise ValidationError({"dataset": f"{exc.field}: {exc.message}"}) from None
    with transaction.atomic():
        Run.objects.select_for_update().filter(pk=run.pk).first()
        pending = (Job.objects.filter(run=run, kind=Job.Kind.EVALUATE, dataset=dataset, checkpoint=checkpoint, status__in=Job.ACTIVE)
                   .exclude(params__has_key="ablation").order_by("created", "id").first())
        if pending is not None:
            return pending
        return job_create(
            team=run.team, user=user, kind=Job.Kind.EVALUATE, run=run, checkpoint=checkpoint, dataset=dataset,
            params={"config_yaml": config.to_yaml(), "checkpoint_step": checkpoint.step if checkpoint else None,
                    "dataset_name": dataset.name},
        )


EvaluateFn = Callable[..., list[dict[str, Any]]]


JOB_EXAMPLES = 3
"""Episodes an evaluation job keeps of each evaluation it made."""


def evaluation_execute(*, job_id: int, evaluate: EvaluateFn | None = None, worker: str = "") -> Job | None:
    job = _claim(job_id, Job.Kind.EVALUATE, worker)
    if job is None:
        return None

    def work(job: Job) -> dict[str, Any]:
        config = RunConfig.from_yaml(job.params["config_yaml"])
        trust.check_config(team=job.team, config=config)
        ablation = job.params.get("ablation")  # webapp.jobs.ablations: the run's team with one thing changed
        partner = _partner_path(job)  # `apart`: the trials' other half
        if ablation:
            results = (evaluate or _evaluate_ablation)(config, _checkpoint_path(job), ablation=ablation,
                                                       **({"partner": partner} if partner is not None else {}))
        else:
            results = (evaluate or _evaluate_checkpoint)(config, _checkpoint_path(job))
        # every episode on its own row (the run page links them); the numbers and a few episodes
        # (which weights played) on the job's row, which stays small
        with transaction.atomic():
            JobEpisode.objects.filter(job=job).delete()  # a job done again keeps its last evaluation's
            JobEpisode.objects.bulk_create(JobEpisode.played(ep, job=job, evaluation=k, episode=i)
                                           for k, r in enumerate(results)
                                           for i, ep in enumerate(r.get("episodes") or []) if isinstance(ep, dict))
        return {"result": {"evaluations": storable([{**summary(r), "examples": r.get("episodes", [])[:JOB_EXAMPLES]} for r in results])}}

    return _run_job(job, work)


def _evaluate_checkpoint(config: RunConfig, checkpoint: str | None) -> list[dict[str, Any]]:
    from training.evaluation import evaluate_checkpoint  # imports torch: only in the worker

    return evaluate_checkpoint(config, checkpoint)


def _evaluate_ablation(config: RunConfig, checkpoint: str | None, *, ablation: str, partner: str | None = None) -> list[dict[str, Any]]:
    from training.ablation import Ablation, evaluate_ablation  # imports torch: only in the worker

    return evaluate_ablation(config, checkpoint, Ablation.parse(ablation, paired=partner is not None), partner=partner)


# == merged export ====================================================================================


MERGE_DTYPES = {"bfloat16": "bf16", "trained": "as trained"}  # training.export.EXPORT_DTYPES, with their labels
"""How a merged model is saved: bf16 (half the size of fp32, what GPUs serve), or the dtype the
run trained in (`model.dtype`; `auto` trains in bf16 on a GPU and fp32 on a CPU)."""


def merge_request(*, run: Run, user: User | None, checkpoint: Checkpoint, agent: str, dtype: str = "bfloat16") -> Job:
    """Queue merging `agent`'s LoRA adapter at `checkpoint` into the run's base model, saved in
    `dtype` (`MERGE_DTYPES`). A finished export of the same adapter and dtype whose folder still
    exists is returned instead of a new job."""
    if dtype not in MERGE_DTYPES:
        raise ValidationError({"dtype": f"Export as one of: {', '.join(MERGE_DTYPES)}."})
    return _merge_job(run=run, user=user, checkpoint=checkpoint, agent=agent, params={"dtype": dtype},
                      full_model=f"{agent} is a full model already; download it as it is.")


def _merge_job(*, run: Run, user: User | None, checkpoint: Checkpoint, agent: str, params: dict[str, str], full_model: str) -> Job:
    """A merge job for `agent`'s adapter at `checkpoint` with these `params` (a merged model's dtype,
    or a GGUF export's format and type): one still queued or running, or a finished one whose folder
    still exists, is returned instead of a new one. `full_model`: the refusal when the agent has
    no adapter to merge."""
    _checked_checkpoint(run, checkpoint)
    try:
        _, policy = artifacts.policy_folder(run=run, checkpoint=checkpoint, name=agent)
    except artifacts.ArtifactMissing as exc:
        raise ValidationError({"agent": str(exc)}) from None
    if policy.kind != "adapter":
        raise ValidationError({"agent": full_model})
    same = {f"params__{key}": value for key, value in params.items()}
    existing = Job.objects.filter(run=run, kind=Job.Kind.MERGE, checkpoint=checkpoint, params__agent=agent, **same) \
        .exclude(status=Job.Status.FAILED).order_by("-created").first()
    if existing is not None and (existing.is_active or Path(existing.output or "/nonexistent").is_dir()):
        return existing
    return job_create(team=run.team, user=user, kind=Job.Kind.MERGE, run=run, checkpoint=checkpoint,
                      params={"agent": agent, "checkpoint_step": checkpoint.step, **params})


def merge_out_dir(job: Job) -> Path:
    return paths.exports_dir(job.team_id) / f"merge-{job.pk}"


# -- GGUF export: a merge job whose params say `format: gguf` ---------------------------------------


GGUF_TYPES = {"f16": "GGUF f16", "q8_0": "GGUF q8_0"}  # training.export.GGUF_TYPES, with their labels
"""The GGUF weight types: f16, or q8_0 (8-bit blocks, about half the size; what CPUs serve)."""


def gguf_request(*, run: Run, user: User | None, checkpoint: Checkpoint, agent: str, gguf_type: str = "q8_0") -> Job:
    """Queue merging `agent`'s LoRA adapter at `checkpoint` into the run's base model and writing
    it as one GGUF file of `gguf_type` (GGUF_TYPES) with an Ollama Modelfile. A finished export of
    the same adapter and type whose folder still exists (or one still queued or running) is
    returned instead of a new job. An agent saved as a full model is refused; an architecture
    llama.cpp's converter does not know fails the job with that said, before anything is merged."""
    if gguf_type not in GGUF_TYPES:
        raise ValidationError({"gguf_type": f"Export GGUF as one of: {', '.join(GGUF_TYPES)}."})
    return _merge_job(run=run, user=user, checkpoint=checkpoint, agent=agent, params={"format": "gguf", "gguf_type": gguf_type},
                      full_model=f"{agent} is a full model, not a LoRA adapter: there is nothing to merge for a GGUF export.")


def _gguf_work(job: Job) -> dict[str, Any]:
    """The worker's part of a GGUF export job (`merge_execute` calls it):
    `training.export.export_gguf` into the team's exports folder; returns the job's fields."""
    from training.export import export_gguf  # imports torch: only in the worker

    assert job.run is not None and job.checkpoint is not None
    adapter, _ = artifacts.policy_folder(run=job.run, checkpoint=job.checkpoint, name=job.params["agent"])
    export = export_gguf(
        job.run.to_config(), agent=job.params["agent"], adapter=adapter, out=merge_out_dir(job),
        gguf_type=job.params["gguf_type"],
        about={"run": job.run.pk, "run_name": job.run.name, "checkpoint_step": job.checkpoint.step},
    )
    return {"output": str(export.folder), "result": {"files": export.files, "architecture": export.architecture}}


def merge_execute(*, job_id: int, worker: str = "") -> Job | None:
    """Claim the merge job, merge the adapter (`training.export.merge_adapter`), record the folder."""
    job = _claim(job_id, Job.Kind.MERGE, worker)
    if job is None:
        return None
    if job.params.get("format") == "gguf":  # a GGUF export: gguf_request
        return _run_job(job, _gguf_work)

    def work(job: Job) -> dict[str, Any]:
        from training.export import merge_adapter  # imports torch: only in the worker

        assert job.run is not None and job.checkpoint is not None
        adapter, _ = artifacts.policy_folder(run=job.run, checkpoint=job.checkpoint, name=job.params["agent"])
        export = merge_adapter(
            job.run.to_config(), agent=job.params["agent"], adapter=adapter, out=merge_out_dir(job),
            dtype=job.params.get("dtype", "bfloat16"),
            about={"run": job.run.pk, "run_name": job.run.name, "checkpoint_step": job.checkpoint.step},
        )
        return {"output": str(export.folder), "result": {"files": export.files}}

    return _run_job(job, work)


# == playground =======================================================================================


def playground_config(*, topology: Topology | None = None, checkpoint: Checkpoint | None = None) -> RunConfig:
    """The config the agents play with: the checkpoint's run's, or the topology's base models."""
    if checkpoint is not None:
        return checkpoint.run.to_config()
    assert topology is not None
    return RunConfig.from_dict({"name": "playground", **catalog_selectors.topology_config_tree(topology=topology)})


def playground_row(*, environment_fields: tuple[str, ...], values: dict[str, str]) -> dict[str, Any]:
    """A dataset row from the typed fields: JSON lists/objects/numbers are parsed, the rest kept
    as text; every field the environment requires must be there (the expected answer may be
    empty: the agents still play, nothing counts as solved)."""
    row: dict[str, Any] = {}
    for key, raw in values.items():
        text = (raw or "").replace("\x00", "")
        if len(text) > PLAYGROUND_FIELD_CHARS:
            raise ValidationError({key: f"At most {PLAYGROUND_FIELD_CHARS:,} characters."})
        if text.strip()[:1] in ("[", "{"):
            try:
                row[key] = trust.json_load(text, field=key)
                continue
            except ConfigError as exc:
                raise ValidationError({key: f"Looks like JSON but is not usable: {exc.message}."}) from None
        row[key] = text
    primary = environment_fields[0] if environment_fields else None
    if primary and not str(row.get(primary, "")).strip():
        raise ValidationError({primary: "Type the task."})
    missing = [f for f in environment_fields if f not in row]
    if missing:
        raise ValidationError(f"Missing field(s): {', '.join(missing)}.")
    return row


def playground_start(
    *, team: Team, user: User | None, row: dict[str, Any], topology: Topology | None = None,
    checkpoint: Checkpoint | None = None, with_base: bool = False, temperature: float = 0.0, max_new_tokens: int | None = None,
) -> Job:
    """Queue a playground session: the checkpoint's agents (and the base models beside them when
    `with_base`), or a topology's base models, play `row`."""
    if (topology is None) == (checkpoint is None):
        raise ValidationError({"agents": "Pick a topology or a checkpoint."})
    if topology is not None and topology.team_id != team.pk or checkpoint is not None and checkpoint.run.team_id != team.pk:
        raise ValidationError({"agents": "Pick your team's agents."})
    if checkpoint is not None:
        _checked_checkpoint(checkpoint.run, checkpoint)
    if not 0.0 <= temperature <= 2.0:
        raise ValidationError({"temperature": "Between 0 (greedy) and 2."})
    if max_new_tokens is not None and not 1 <= max_new_tokens <= PLAYGROUND_MAX_TOKENS:
        raise ValidationError({"max_new_tokens": f"Between 1 and {PLAYGROUND_MAX_TOKENS}."})
    try:
        config = playground_config(topology=topology, checkpoint=checkpoint)
    except ConfigError as exc:
        raise ValidationError({"agents": str(exc)}) from None
    env = environments.environment_load(name=config.topology.environment, env_args=config.topology.env_args, args_field="agents")
    missing = [f for f in env.required_fields if f not in row]
    if missing:
        raise ValidationError(f"{env.name} tasks need: {', '.join(missing)}.")
    lanes = []
    if checkpoint is not None:
        lanes.append(playground_lane(f"Run #{checkpoint.run_id} · step {checkpoint.step}", trained=True))
    if checkpoint is None or with_base:
        lanes.append(playground_lane(untrained_label(config).capitalize(), trained=False))
    return job_create(
        team=team, user=user, kind=Job.Kind.PLAYGROUND, topology=topology, checkpoint=checkpoint,
        run=checkpoint.run if checkpoint else None,
        params={"config_yaml": config.to_yaml(), "row": row, "temperature": temperature, "max_new_tokens": max_new_tokens,
                "checkpoint_step": checkpoint.step if checkpoint else None},
        result={"lanes": lanes},
    )


def playground_execute(*, job_id: int, worker: str = "") -> Job | None:
    """Claim the playground job and play its task in every lane (`training.playground.play`),
    saving the transcript to the row after each turn (the page polls it)."""
    job = _claim(job_id, Job.Kind.PLAYGROUND, worker)
    if job is None:
        return None

    def work(job: Job) -> dict[str, Any]:
        from training.playground import play  # imports torch: only in the worker

        config = RunConfig.from_yaml(job.params["config_yaml"])
        trust.check_config(team=job.team, config=config)
        result = job.result

        def save(_: Any) -> None:
            Job.objects.filter(pk=job.pk).update(result=storable(result))

        play(config, job.params["row"], lanes=result["lanes"], checkpoint=_checkpoint_path(job),
             temperature=float(job.params.get("temperature") or 0.0), max_new_tokens=job.params.get("max_new_tokens"),
             on_turn=save)
        return {"result": storable(result)}

    return _run_job(job, work)


def playground_example(*, environment: str, env_args: dict[str, Any]) -> dict[str, Any]:
    """A random task from the environment's generator, to fill the form."""
    import random

    env = environments.environment_load(name=environment, env_args=env_args)
    (row,) = env.generate(1, seed=random.randrange(1_000_000))
    return row
