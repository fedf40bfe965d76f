"""The audit trail: the services that create, launch, cancel, resume, delete or export things, and
those that manage members, record who did it; a team admin reads the team's trail on the Audit
page (filtered by action, actor and object, paginated), nobody else does, and nobody edits it."""

from __future__ import annotations

import io

import pytest
import yaml
from django.contrib.auth.models import User
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.urls import reverse

from tests.webapp.conftest import jsonl
from tests.webapp.history_helpers import with_out_dir
from webapp.artifacts import services as artifacts
from webapp.catalog import services as catalog
from webapp.jobs import services as jobs
from webapp.models import AuditEvent, Checkpoint, Dataset, Job, Membership, Run, Team
from webapp.runs import services as runs
from webapp.teams import services as teams
from webapp.teams.audit import audit_record


def _last(team) -> AuditEvent:
    return AuditEvent.objects.filter(team=team).first()


def _trail(team) -> list[tuple[str, str, str, str]]:
    return [(e.actor_name, e.verb, e.object_type, e.object_label) for e in AuditEvent.objects.filter(team=team).order_by("id")]


def test_it_records_runs_launched_cancelled_and_resumed_with_who(alice, alice_world, enqueued):
    run = alice_world.run
    response = alice.client.post(reverse("run_cancel", args=[run.pk]))
    assert response.status_code == 302
    event = _last(alice.team)
    assert (event.actor, event.verb, event.object_type, event.object_id) == (alice.user, "cancel", "run", run.pk)
    assert event.details == {"was": "queued"}
    alice.client.post(reverse("run_cancel", args=[run.pk]))  # nothing left to cancel: nothing recorded
    assert AuditEvent.objects.filter(verb="cancel").count() == 1

    Checkpoint.objects.create(run=run, step=2, path="/tmp/ck/step-000002")
    alice.client.post(reverse("run_resume", args=[run.pk]))
    new = Run.objects.get(resumed_from=run)
    resumed = _last(alice.team)
    assert (resumed.verb, resumed.object_id, resumed.details) == ("resume", run.pk, {"new_run": new.pk, "from_step": 2})
    assert not AuditEvent.objects.filter(verb="launch", object_id=new.pk).exists()  # one event for a resume

    tree = yaml.safe_load(run.config_yaml)
    tree["optim"]["steps"] = 2
    launched = runs.run_launch(team=alice.team, user=alice.user, tree=tree, name="from the API")
    event = _last(alice.team)
    assert (event.verb, event.object_id, event.actor_name) == ("launch", launched.pk, "alice")
    assert event.details["steps"] == 2 and event.object_label == f"#{launched.pk} from the API"


def test_a_running_run_asked_to_stop_is_recorded_once(alice, alice_world):
    Run.objects.filter(pk=alice_world.run.pk).update(status="running", step=1)
    for _ in range(2):
        runs.run_cancel(run=alice_world.run, actor=alice.user)
    assert [e.details for e in AuditEvent.objects.filter(verb="cancel")] == [{"was": "running", "at_step": 1}]


def test_it_records_catalog_objects_created_and_deleted(alice, alice_world, good_rows):
    team, user = alice.team, alice.user
    source = catalog.model_source_save(team=team, name="Other", source="tiny-random:llama", actor=user)
    catalog.model_source_save(team=team, name="Renamed", source="tiny-random:llama", instance=source, actor=user)  # an edit: not recorded
    agent = catalog.agent_create(team=team, actor=user, name="critic", role="reasoner", model_source=source)
    copy = catalog.agent_duplicate(agent=agent, actor=user)
    topology = catalog.topology_duplicate(topology=alice_world.topology, actor=user)
    upload = SimpleUploadedFile("rows.jsonl", jsonl(good_rows))
    uploaded = catalog.dataset_upload(team=team, name="mine", environment="math_tool", upload=upload, eval_fraction=0.2, actor=user)
    generated = catalog.dataset_generator_create(team=team, name="gen", environment="math_tool", env_args={"level": 1},
                                                 size=4, eval_size=2, actor=user)
    uploaded_id = uploaded.pk
    for delete in (lambda: catalog.dataset_delete(dataset=uploaded, actor=user),
                   lambda: catalog.topology_delete(topology=topology, actor=user),
                   lambda: catalog.agent_delete(agent=copy, actor=user),
                   lambda: catalog.agent_delete(agent=agent, actor=user),
                   lambda: catalog.model_source_delete(source=source, actor=user)):
        delete()
    assert _trail(team) == [
        ("alice", "create", "model source", "Other"),
        ("alice", "create", "agent", "critic"),
        ("alice", "create", "agent", copy.name),
        ("alice", "create", "topology", topology.name),
        ("alice", "create", "dataset", "mine"),
        ("alice", "create", "dataset", "gen"),
        ("alice", "delete", "dataset", "mine"),
        ("alice", "delete", "topology", topology.name),
        ("alice", "delete", "agent", copy.name),
        ("alice", "delete", "agent", "critic"),
        ("alice", "delete", "model source", "Renamed"),
    ]
    assert AuditEvent.objects.get(verb="create", object_label=copy.name).details == {"role": "reasoner", "copy_of": "critic"}
    assert AuditEvent.objects.get(verb="create", object_label="mine").details["rows"] == len(good_rows)
    assert AuditEvent.objects.get(verb="delete", object_label="mine").object_id == uploaded_id  # read before the delete
    assert generated.pk and AuditEvent.objects.filter(actor=None).count() == 0


def test_the_catalog_pages_record_the_member_who_acted(alice, alice_world):
    Run.objects.filter(pk=alice_world.run.pk).update(status="succeeded")  # a queued run would keep its dataset
    alice.client.post(reverse("agent_duplicate", args=[alice_world.tool.pk]))
    alice.client.post(reverse("dataset_delete", args=[alice_world.dataset.pk]))
    assert [(e.actor, e.verb, e.object_type) for e in AuditEvent.objects.order_by("id")] == [
        (alice.user, "create", "agent"), (alice.user, "delete", "dataset")]


def test_it_records_deletions_and_exports_of_a_runs_files(alice, alice_world, data_dir, jobs_sent):
    run = with_out_dir(alice_world.run, data_dir)
    Run.objects.filter(pk=run.pk).update(status="succeeded")
    folders = {}
    for step in (2, 4):
        folders[step] = data_dir / "runs" / str(run.pk) / "checkpoints" / f"step-{step:06d}"
        (folders[step] / "tool").mkdir(parents=True)
        (folders[step] / "tool" / "adapter_model.safetensors").write_bytes(b"x" * 1000)
        Checkpoint.objects.create(run=run, step=step, path=str(folders[step]))
    response = alice.client.post(reverse("run_checkpoint_delete", args=[run.pk, 2]))
    assert response.status_code == 302 and not folders[2].exists()
    event = _last(alice.team)
    assert (event.actor, event.verb, event.object_type, event.object_label, event.details) == (
        alice.user, "delete", "checkpoint", f"run #{run.pk} step 2", {"bytes": 1000})

    merge = Job.objects.create(team=alice.team, kind="merge", status="succeeded", run=run, params={"agent": "tool"},
                               output=str(data_dir / "exports" / str(alice.team.pk) / "merge-1"))
    (data_dir / "exports" / str(alice.team.pk) / "merge-1").mkdir(parents=True)
    artifacts.export_delete(job=merge, actor=alice.user)
    assert (_last(alice.team).verb, _last(alice.team).object_type, _last(alice.team).details) == ("delete", "export", {"bytes": 0, "agent": "tool"})

    evaluation = jobs.evaluation_request(run=run, user=alice.user, dataset=alice_world.dataset, checkpoint=None)
    event = _last(alice.team)
    assert (event.verb, event.object_type, event.object_id, event.details) == (
        "launch", "evaluation", evaluation.pk, {"dataset_name": alice_world.dataset.name})


def test_it_records_a_merge_as_an_export(alice, alice_world, data_dir, jobs_sent, monkeypatch):
    from webapp.artifacts import files

    run = alice_world.run
    checkpoint = Checkpoint.objects.create(run=run, step=4, path=str(data_dir / "ck"))
    monkeypatch.setattr(jobs, "_checked_checkpoint", lambda run, checkpoint: None)
    monkeypatch.setattr(files, "policy_folder", lambda **kw: (None, type("P", (), {"kind": "adapter"})()))
    job = jobs.merge_request(run=run, user=alice.user, checkpoint=checkpoint, agent="tool")
    event = _last(alice.team)
    assert (event.actor, event.verb, event.object_type, event.object_id) == (alice.user, "export", "export", job.pk)
    assert event.details == {"agent": "tool", "checkpoint_step": 4, "dtype": "bfloat16"}


def test_it_records_members_invited_joined_promoted_and_removed(alice, settings):
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    response = alice.client.post(reverse("team_invite"), {"email": "carl@example.org", "role": "member"}, follow=True)
    link = response.context["new_link"]
    visitor = Client()
    visitor.post(link, {"username": "carl", "password1": "a long pass phrase", "password2": "a long pass phrase"})
    carl = Membership.objects.get(user__username="carl")
    alice.client.post(reverse("team_member_role", args=[carl.pk]), {"role": "admin"})
    visitor.post(reverse("team_member_remove", args=[carl.pk]))  # carl leaves
    _, other_link = teams.invitation_create(team=alice.team, by=alice.user, role="member", link_for=str)
    invitation = alice.team.invitations.filter(accepted=None).get()
    alice.client.post(reverse("team_invitation_revoke", args=[invitation.pk]))
    assert _trail(alice.team) == [
        ("alice", "invite", "invitation", "carl@example.org"),
        ("carl", "join", "member", "carl"),
        ("alice", "role", "member", "carl"),
        ("carl", "remove", "member", "carl"),
        ("alice", "invite", "invitation", "a link"),
        ("alice", "revoke", "invitation", "a link"),
    ]
    events = list(AuditEvent.objects.order_by("id"))
    assert events[2].details == {"before": "member", "after": "admin"}
    assert events[3].details == {"role": "admin", "left": True}
    assert "@" not in str(events[0].details) and other_link not in str(events[4].details)  # no secret in the trail


def test_the_record_outlives_its_actor_and_object(alice, alice_world):
    carl = User.objects.create_user("carl", password="password")
    audit_record(team=alice.team, actor=carl, verb="delete", obj=alice_world.dataset)
    carl.delete()
    alice_world.dataset.delete()
    event = _last(alice.team)
    assert (event.actor, event.actor_name, event.object_label) == (None, "carl", "gen L1")
    assert "carl" in alice.client.get(reverse("team_audit")).content.decode()


def test_an_unknown_verb_is_a_programming_error(alice, alice_world):
    with pytest.raises(ValueError, match="unknown audit verb"):
        audit_record(team=alice.team, actor=alice.user, verb="touched", obj=alice_world.run)


# == the Audit page ==================================================================================


@pytest.fixture
def trail(alice, alice_world, bob, bob_world):
    """alice's team: 60 launches by alice, 3 deletions by dora, 1 by Troupe; bob's team: 1 event."""
    dora = User.objects.create_user("dora", password="password")
    Membership.objects.create(team=alice.team, user=dora, role="member")
    for _ in range(60):
        audit_record(team=alice.team, actor=alice.user, verb="launch", obj=alice_world.run, steps=3)
    for _ in range(3):
        audit_record(team=alice.team, actor=dora, verb="delete", obj=alice_world.dataset, bytes=2048)
    audit_record(team=alice.team, actor=None, verb="create", obj=alice_world.topology)
    audit_record(team=bob.team, actor=bob.user, verb="delete", obj=bob_world.tool)
    return dora


def test_a_team_admin_reads_the_trail_newest_first_in_pages(alice, trail):
    page = alice.client.get(reverse("team_audit"))
    assert page.status_code == 200
    html = page.content.decode()
    assert "64 events" in html and "Page 1 of 2" in html
    rows = list(page.context["page"])
    assert len(rows) == 50 and rows[0].actor is None and rows[1].actor_name == "dora"
    assert "2.0\xa0KB" in html and "Troupe" in html
    assert f'href="{reverse("run_detail", args=[rows[-1].object_id])}"' in html  # a run links to its page
    second = alice.client.get(reverse("team_audit"), {"page": 2})
    assert len(second.context["page"]) == 14
    assert "tool" not in [e.object_label for e in second.context["page"]]  # bob's event is not in alice's trail


def test_the_trail_filters_by_action_actor_and_object(alice, trail):
    by_dora = alice.client.get(reverse("team_audit"), {"actor": "dora"})
    assert [e.actor_name for e in by_dora.context["page"]] == ["dora"] * 3
    deletes = alice.client.get(reverse("team_audit"), {"verb": "delete"})
    assert deletes.context["page"].paginator.count == 3
    system = alice.client.get(reverse("team_audit"), {"actor": "(troupe)", "object_type": "topology"})
    assert [e.object_label for e in system.context["page"]] == ["duo"]
    paged = alice.client.get(reverse("team_audit"), {"verb": "launch", "page": 2}).content.decode()
    assert "verb=launch&amp;page=1" in paged  # the pager keeps the filters
    bad = alice.client.get(reverse("team_audit"), {"verb": "touched", "actor": "mallory"})
    assert bad.status_code == 400
    html = bad.content.decode()
    assert html.count("Select a valid choice") == 2 and 'id="errors-verb"' in html and 'id="errors-actor"' in html


def test_only_team_admins_and_staff_read_the_trail(alice, bob, trail):
    dora = Client()
    dora.force_login(trail)
    assert dora.get(reverse("team_audit")).status_code == 403
    assert "Audit" not in dora.get(reverse("dashboard")).content.decode().split("</nav>")[0]
    assert 'href="/team/audit/"' in alice.client.get(reverse("dashboard")).content.decode()
    User.objects.filter(pk=trail.pk).update(is_staff=True)
    assert dora.get(reverse("team_audit")).status_code == 200
    assert bob.client.get(reverse("team_audit")).status_code == 403  # a member of Bravo
    Membership.objects.filter(user=bob.user).update(role="admin")
    assert [e.object_label for e in bob.client.get(reverse("team_audit")).context["page"]] == ["tool"]


def test_the_admin_shows_the_trail_read_only(alice, trail):
    root = User.objects.create_superuser("root", password="password")
    client = Client()
    client.force_login(root)
    listing = client.get(reverse("admin:webapp_auditevent_changelist"))
    assert listing.status_code == 200 and "dora" in listing.content.decode()
    event = AuditEvent.objects.filter(verb="delete", actor_name="dora").first()
    change = client.get(reverse("admin:webapp_auditevent_change", args=[event.pk])).content.decode()
    assert 'name="_save"' not in change and "dora" in change
    assert client.get(reverse("admin:webapp_auditevent_add")).status_code == 403
    assert client.post(reverse("admin:webapp_auditevent_change", args=[event.pk]), {"verb": "launch"}).status_code == 403
    event.refresh_from_db()
    assert event.verb == "delete"
    # deleting a team takes its trail along (why a superuser may delete events)
    charlie = Team.objects.create(name="Charlie")
    audit_record(team=charlie, actor=root, verb="create", obj=charlie)
    assert client.post(reverse("admin:webapp_team_delete", args=[charlie.pk]), {"post": "yes"}).status_code == 302
    assert not AuditEvent.objects.filter(team_id=charlie.pk).exists()


def test_a_dataset_uploaded_from_the_page_is_recorded(alice, good_rows):
    upload = io.BytesIO(jsonl(good_rows))
    upload.name = "rows.jsonl"
    alice.client.post(reverse("dataset_upload"), {"name": "up", "environment": "math_tool", "eval_fraction": "0.2", "file": upload})
    dataset = Dataset.objects.get(name="up")
    event = _last(alice.team)
    assert (event.actor, event.verb, event.object_id, event.details["file"]) == (alice.user, "create", dataset.pk, "rows.jsonl")


def test_it_names_each_object_type_once(alice, alice_world, data_dir, jobs_sent):
    run = with_out_dir(alice_world.run, data_dir)
    Run.objects.filter(pk=run.pk).update(status="succeeded")
    evaluation = jobs.evaluation_request(run=run, user=alice.user, dataset=alice_world.dataset, checkpoint=None)
    merge = Job.objects.create(team=alice.team, kind="merge", status="succeeded", run=run, params={"agent": "tool"},
                               output=str(data_dir / "exports" / str(alice.team.pk) / "merge-9"))
    artifacts.export_delete(job=merge, actor=alice.user)
    # an event recorded before job labels dropped their type, and an agent whose name starts with its type
    old = AuditEvent.objects.create(team=alice.team, actor_name="alice", verb="launch", object_type="evaluation",
                                    object_id=5, object_label=f"evaluation #5 of run #{run.pk}")
    AuditEvent.objects.create(team=alice.team, actor_name="alice", verb="create", object_type="agent", object_id=9,
                              object_label="agent #2 of the red team")
    page = " ".join(alice.client.get(reverse("team_audit")).content.decode().split())
    for kind, pk in (("evaluation", evaluation.pk), ("export", merge.pk), ("evaluation", old.object_id)):
        assert f'<span class="muted">{kind}</span> #{pk} of run #{run.pk}' in page
    assert "evaluation evaluation" not in page and "export export" not in page
    assert '<span class="muted">agent</span> agent #2 of the red team' in page
    assert str(old) == f"alice launched evaluation #5 of run #{run.pk}"
