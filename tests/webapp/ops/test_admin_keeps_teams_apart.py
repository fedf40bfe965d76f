"""The admin edits only what each form is for, and links nothing across teams: site staff given
`change_run` to set priorities cannot move a run (or a model, agent, topology, dataset or tag) to
another team, give it another team's topology or dataset, or link another team's agent into a
topology; the rows the engine and the services write (checkpoints, jobs, metric points...) are
read-only there."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib import admin
from django.contrib.auth.models import Permission, User
from django.forms import ModelChoiceField, SplitDateTimeWidget
from django.test import Client, RequestFactory
from django.urls import reverse
from django.utils import timezone

from webapp.models import (
    Agent,
    ApiToken,
    AuditEvent,
    Checkpoint,
    Dataset,
    Evaluation,
    EvaluationEpisode,
    Experiment,
    Grader,
    Invitation,
    Job,
    JobEpisode,
    LogLine,
    Membership,
    MetricPoint,
    ModelSource,
    Rollout,
    Run,
    Tag,
    Task,
    Team,
    Topology,
    TopologyAgent,
    Worker,
)

EDITABLE_LINKS = {
    # (model, field) a change or add form may set to another webapp row, each checked by the model's `clean` (tests below)
    ("agent", "model_source"), ("topologyagent", "agent"), ("topologyagent", "topology"), ("task", "dataset"),
    # the team of a new object (never of an existing one), and a membership (a user in a team: what the form is for)
    ("modelsource", "team"), ("agent", "team"), ("topology", "team"), ("dataset", "team"), ("tag", "team"), ("membership", "team"),
    ("grader", "team"), ("task", "team"),
}


@pytest.fixture
def superuser(alice):
    alice.user.is_staff = alice.user.is_superuser = True
    alice.user.save()
    return alice


@pytest.fixture
def run_staff(db) -> Client:
    """Site staff given what the README says staff need to order the queue: view and change runs."""
    user = User.objects.create_user("staff", password="password", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=["view_run", "change_run"]))
    client = Client()
    client.force_login(user)
    return client


def _form_data(response: Any) -> dict[str, Any]:
    """What the admin's change page would post back unchanged: its form's and inline formsets' values."""
    data: dict[str, Any] = {}

    def add(form: Any, prefix: str = "") -> None:
        for name, field in form.fields.items():
            key, value = (f"{prefix}-{name}" if prefix else name), form[name].value()
            if isinstance(field.widget, SplitDateTimeWidget):
                for i, part in enumerate(field.widget.decompress(value)):
                    data[f"{key}_{i}"] = "" if part is None else str(part)
            elif isinstance(value, bool):
                if value:
                    data[key] = "on"
            elif isinstance(value, (list, tuple)):
                data[key] = [str(getattr(v, "pk", v)) for v in value]
            elif value is not None:
                data[key] = str(getattr(value, "pk", value))

    add(response.context["adminform"].form)
    for inline in response.context["inline_admin_formsets"]:
        formset = inline.formset
        add(formset.management_form, formset.prefix)
        for i, form in enumerate(formset.forms):
            add(form, f"{formset.prefix}-{i}")
    return data


def _post_change(client: Client, obj: Any, **changes: Any) -> Any:
    url = reverse(f"admin:webapp_{obj._meta.model_name}_change", args=[obj.pk])
    page = client.get(url)
    assert page.status_code == 200
    return client.post(url, {**_form_data(page), **changes})


def test_staff_who_set_priorities_cannot_move_a_run_to_another_team(run_staff, alice_world, bob, bob_world):
    run = alice_world.run
    experiment = Experiment.objects.create(team=bob.team, owner=bob.user, name="theirs", spec_yaml="{}")
    response = _post_change(run_staff, run, priority="5", team=str(bob.team.pk), owner=str(bob.user.pk),
                            topology=str(bob_world.topology.pk), dataset=str(bob_world.dataset.pk), experiment=str(experiment.pk),
                            resumed_from=str(bob_world.run.pk), tags=[str(Tag.objects.create(team=bob.team, name="b").pk)])
    assert response.status_code == 302, response.context["adminform"].form.errors
    run.refresh_from_db()
    assert run.priority == 5  # what the form is for
    assert (run.team_id, run.owner_id, run.topology_id, run.dataset_id, run.experiment_id, run.resumed_from_id) == (
        alice_world.run.team_id, alice_world.run.owner_id, alice_world.topology.pk, alice_world.dataset.pk, None, None)
    assert not run.tags.exists()


def test_no_team_owned_object_moves_to_another_team(superuser, alice_world, bob):
    tag = Tag.objects.create(team=superuser.team, name="baseline")
    for obj in (alice_world.source, alice_world.tool, alice_world.topology, alice_world.dataset, tag):
        response = _post_change(superuser.client, obj, team=str(bob.team.pk))
        assert response.status_code == 302, (obj, response.context and response.context["adminform"].form.errors)
        obj.refresh_from_db()
        assert obj.team_id == superuser.team.pk, obj


def test_a_topology_takes_no_agent_of_another_team(superuser, alice_world, bob_world):
    topology = alice_world.topology
    url = reverse("admin:webapp_topology_change", args=[topology.pk])
    data = _form_data(superuser.client.get(url))
    data.update({"members-TOTAL_FORMS": "3", "members-2-agent": str(bob_world.tool.pk), "members-2-position": "3",
                 "members-2-topology": str(topology.pk)})
    response = superuser.client.post(url, data)
    assert response.status_code == 200 and "of the topology&#x27;s team" in response.content.decode()
    assert [a.name for a in topology.ordered_agents()] == ["tool", "reasoner"]
    assert not TopologyAgent.objects.filter(agent=bob_world.tool, topology=topology).exists()

    link = TopologyAgent.objects.get(topology=topology, agent=alice_world.tool)
    response = _post_change(superuser.client, link, agent=str(bob_world.reasoner.pk))
    assert response.status_code == 200
    link.refresh_from_db()
    assert link.agent_id == alice_world.tool.pk
    response = _post_change(superuser.client, link, topology=str(bob_world.topology.pk))
    assert response.status_code == 200
    link.refresh_from_db()
    assert link.topology_id == topology.pk


def test_a_task_takes_no_dataset_of_another_team(superuser, alice_world, bob_world):
    task = Task.objects.create(team=superuser.team, name="t", dataset=alice_world.dataset, roles=[{"name": "a", "prompt": "x"}])
    response = _post_change(superuser.client, task, dataset=str(bob_world.dataset.pk))
    assert response.status_code == 200 and "dataset" in response.context["adminform"].form.errors
    assert Task.objects.get(pk=task.pk).dataset_id == alice_world.dataset.pk


def test_an_agent_takes_no_model_of_another_team(superuser, alice_world, bob_world):
    response = _post_change(superuser.client, alice_world.tool, model_source=str(bob_world.source.pk))
    assert response.status_code == 200
    assert Agent.objects.get(pk=alice_world.tool.pk).model_source_id == alice_world.source.pk
    response = superuser.client.post(reverse("admin:webapp_agent_add"), {
        "team": superuser.team.pk, "name": "spy", "role": "tool", "instructions": "", "model_source": bob_world.source.pk, "tools": "[]",
        "created_0": "2026-01-01", "created_1": "00:00"})
    assert response.status_code == 200 and "model_source" in response.context["adminform"].form.errors
    assert not Agent.objects.filter(name="spy").exists()


def test_records_are_read_only_in_the_admin(superuser, alice_world, bob_world):
    run = alice_world.run
    checkpoint = Checkpoint.objects.create(run=run, step=2, path="/x/step-2")
    job = Job.objects.create(team=superuser.team, kind="evaluate", run=run, checkpoint=checkpoint, dataset=alice_world.dataset)
    for obj in (checkpoint, job, MetricPoint.objects.create(run=run, step=1, time=timezone.now()),
                Rollout.objects.create(run=run, step=1, episode=0, data={}), Evaluation.objects.create(run=run, step=1, team_success=0.5),
                LogLine.objects.create(run=run, message="x")):
        url = reverse(f"admin:webapp_{obj._meta.model_name}_change", args=[obj.pk])
        page = superuser.client.get(url)
        assert page.status_code == 200 and not page.context["adminform"].form.fields, obj  # shown, nothing to edit
        superuser.client.post(url, {"run": bob_world.run.pk, "path": "/elsewhere", "checkpoint": "", "team": bob_world.run.team_id})
        obj.refresh_from_db()
        assert obj.run_id == run.pk, obj
    assert Checkpoint.objects.get(pk=checkpoint.pk).path == "/x/step-2"
    assert Job.objects.get(pk=job.pk).team_id == superuser.team.pk


def test_no_admin_form_offers_a_link_to_another_row_beyond_the_checked_ones(superuser, alice_world, bob_world, settings):
    """Every change and add form of every model in the admin, and their inlines: the fields that
    link to a Troupe row are only those whose cross-team values the tests above show refused."""
    run = alice_world.run
    checkpoint = Checkpoint.objects.create(run=run, step=2, path="/x/step-2")
    experiment = Experiment.objects.create(team=superuser.team, owner=superuser.user, name="e", spec_yaml="{}")
    rows = {
        Team: superuser.team, Membership: Membership.objects.get(user=superuser.user), ModelSource: alice_world.source,
        Agent: alice_world.tool, Topology: alice_world.topology, TopologyAgent: TopologyAgent.objects.first(),
        Dataset: alice_world.dataset, Run: run, Checkpoint: checkpoint, Experiment: experiment,
        Tag: Tag.objects.create(team=superuser.team, name="t"),
        Grader: Grader.objects.create(team=superuser.team, name="g", kind="exact"),
        Task: Task.objects.create(team=superuser.team, name="t", dataset=alice_world.dataset, roles=[{"name": "a", "prompt": "x"}]),
        Job: (job := Job.objects.create(team=superuser.team, kind="evaluate", run=run, checkpoint=checkpoint)),
        JobEpisode: JobEpisode.objects.create(job=job, episode=0, data={}),
        MetricPoint: MetricPoint.objects.create(run=run, step=1, time=timezone.now()), Rollout: Rollout.objects.create(run=run, step=1, episode=0, data={}),
        Evaluation: (evaluation := Evaluation.objects.create(run=run, step=1, team_success=0.5)), LogLine: LogLine.objects.create(run=run, message="x"),
        EvaluationEpisode: EvaluationEpisode.objects.create(evaluation=evaluation, episode=0, data={}),
        Worker: Worker.objects.create(hostname="w", run=run),
        ApiToken: ApiToken.objects.create(user=superuser.user, team=superuser.team, name="t", prefix="trp_x", digest="d"),
        Invitation: Invitation.objects.create(team=superuser.team, created_by=superuser.user, digest="d", expires=timezone.now()),
        AuditEvent: AuditEvent.objects.create(team=superuser.team, actor=superuser.user, verb="create", object_type="run", object_id=run.pk),
    }
    request = RequestFactory().get("/")
    request.user = superuser.user
    found: set[tuple[str, str]] = set()
    for model, model_admin in admin.site._registry.items():
        if model._meta.app_label != "webapp":
            continue
        assert model in rows, f"{model.__name__}: give the test a row of it"
        for obj in (rows[model], None):
            if not (model_admin.has_change_permission(request, obj) if obj is not None else model_admin.has_add_permission(request)):
                continue
            forms = [(model, model_admin.get_form(request, obj).base_fields)]
            for inline in model_admin.get_inline_instances(request, obj):
                if inline.has_change_permission(request, obj) or inline.has_add_permission(request, obj):
                    forms.append((inline.model, inline.get_formset(request, obj).form.base_fields))
            for form_model, fields in forms:
                for name, field in fields.items():
                    if isinstance(field, ModelChoiceField) and field.queryset.model._meta.app_label == "webapp":
                        if form_model is not model and field.queryset.model is model:
                            continue  # an inline's link to the object it is shown in
                        if name == "team" and obj is not None:
                            raise AssertionError(f"the team of an existing {form_model.__name__} can be changed")
                        found.add((form_model._meta.model_name, name))
    assert found <= EDITABLE_LINKS, found - EDITABLE_LINKS


def test_the_admin_keeps_what_a_queued_run_needs(superuser, alice_world, data_dir):
    """A checkpoint a queued run starts from, and the dataset it learns from, cannot be deleted from
    the admin either (its launch was checked against those rows, and the worker checks again)."""
    done = alice_world.run
    Run.objects.filter(pk=done.pk).update(status=Run.Status.SUCCEEDED)
    old = Checkpoint.objects.create(run=done, step=2, path=str(data_dir / "runs" / str(done.pk) / "checkpoints" / "step-000002"))
    Checkpoint.objects.create(run=done, step=4, path=str(data_dir / "runs" / str(done.pk) / "checkpoints" / "step-000004"))
    config = done.to_config().replace(**{"model.init_from.run": old.path, "model.init_from.step": 2})
    queued = Run.objects.create(team=superuser.team, name="warm", config_yaml=config.to_yaml(), dataset=alice_world.dataset)
    page = superuser.client.get(reverse("admin:webapp_checkpoint_delete", args=[old.pk]))
    assert page.status_code == 403
    superuser.client.post(reverse("admin:webapp_checkpoint_changelist"), {"action": "delete_selected", "_selected_action": [old.pk],
                                                                          "post": "yes"})
    superuser.client.post(reverse("admin:webapp_run_delete", args=[done.pk]), {"post": "yes"})
    superuser.client.post(reverse("admin:webapp_dataset_delete", args=[alice_world.dataset.pk]), {"post": "yes"})
    assert Checkpoint.objects.filter(pk=old.pk).exists() and Run.objects.filter(pk=done.pk).exists()
    assert Dataset.objects.filter(pk=alice_world.dataset.pk).exists()
    Run.objects.filter(pk=queued.pk).update(status=Run.Status.CANCELLED)
    assert superuser.client.get(reverse("admin:webapp_checkpoint_delete", args=[old.pk])).status_code == 200
