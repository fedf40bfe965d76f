"""The catalog's workflows: model sources, agents, topologies, datasets (uploaded or
generated), and the team's graders and tasks. Every write to them goes through here; one module per entity, re-exported here.

Functions are keyword-only and named `<entity>_<action>`. Domain errors are Django
`ValidationError`s keyed by the field at fault, so a view shows them next to that field. The
reads (delete blockers and effects, the run-config sections, matches) are in
`webapp.catalog.selectors`; the environments in `webapp.catalog.environments`.
"""

from webapp.catalog.services.agents import AGENT_FIELDS, agent_create, agent_delete, agent_duplicate, agent_update
from webapp.catalog.services.datasets import (
    dataset_delete,
    dataset_generator_create,
    dataset_generator_update,
    dataset_revalidate,
    dataset_upload,
    dataset_upload_update,
)
from webapp.catalog.services.model_sources import model_source_delete, model_source_save
from webapp.catalog.services.tasks import (
    TriedRow,
    grader_delete,
    grader_save,
    grader_try,
    task_delete,
    task_save,
    task_topology_create,
    task_try,
)
from webapp.catalog.services.topologies import (
    topology_create,
    topology_delete,
    topology_duplicate,
    topology_problems,
    topology_update,
)

__all__ = [
    "AGENT_FIELDS",
    "agent_create",
    "agent_delete",
    "agent_duplicate",
    "agent_update",
    "dataset_delete",
    "dataset_generator_create",
    "dataset_generator_update",
    "dataset_revalidate",
    "dataset_upload",
    "dataset_upload_update",
    "model_source_delete",
    "model_source_save",
    "TriedRow",
    "grader_delete",
    "grader_save",
    "grader_try",
    "task_delete",
    "task_save",
    "task_topology_create",
    "task_try",
    "topology_create",
    "topology_delete",
    "topology_duplicate",
    "topology_problems",
    "topology_update",
]
