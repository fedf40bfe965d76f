"""Troupe's data. Every object belongs to one team (directly, or through its run/topology).

One module per domain; every model is re-exported here, so `from webapp.models import Run` and the
app label stay as they were and the migrations see no change. Rules about one row live on the
model (`Run.is_active`, `Run.to_config()`, `Dataset.split`); workflows that touch several rows
live in each package's `services.py` (docs/architecture.md).
"""

from training.plan import RAY_QUEUE
from webapp.models.catalog import (
    SPECIALIZATION_CHOICES,
    SPECIALIZATION_HELP,
    SPECIALIZATION_LABELS,
    SPECIALIZATION_SHORT_CHOICES,
    Agent,
    Dataset,
    ModelSource,
    Topology,
    TopologyAgent,
    agent_name_validator,
)
from webapp.models.experiments import Experiment
from webapp.models.history import Tag
from webapp.models.jobs import Job, JobEpisode
from webapp.models.ops import Worker
from webapp.models.runs import Checkpoint, Evaluation, EvaluationEpisode, LogLine, MetricPoint, Rollout, Run, gpu_queue, queue_clock
from webapp.models.tasks import Grader, Task
from webapp.models.teams import ApiToken, AuditEvent, Invitation, Membership, Team

__all__ = [
    "SPECIALIZATION_CHOICES",
    "SPECIALIZATION_HELP",
    "SPECIALIZATION_LABELS",
    "SPECIALIZATION_SHORT_CHOICES",
    "Agent",
    "ApiToken",
    "AuditEvent",
    "Checkpoint",
    "Dataset",
    "Evaluation",
    "EvaluationEpisode",
    "Experiment",
    "Grader",
    "Invitation",
    "Job",
    "JobEpisode",
    "LogLine",
    "Membership",
    "MetricPoint",
    "ModelSource",
    "Rollout",
    "Run",
    "Tag",
    "Task",
    "Team",
    "Topology",
    "TopologyAgent",
    "Worker",
    "agent_name_validator",
    "RAY_QUEUE",
    "gpu_queue",
    "queue_clock",
]
