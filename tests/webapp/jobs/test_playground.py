"""The playground: pick a run's checkpoint (or a topology's base models), type a task (a row built
from the environment's fields), and watch the agents play it turn by turn, tool runs shown; the
trained agents and the base models side by side on the same task. The work is a job on the `gpu`
queue; the page polls the job row, which grows a turn at a time."""

from __future__ import annotations

import pytest
from django.urls import reverse

from tests.webapp.history_helpers import save_checkpoint, with_out_dir
from webapp.jobs import services as jobs
from webapp.models import Job, Run

HX = {"HX-Request": "true"}


@pytest.fixture
def checkpoint(alice, alice_world, data_dir):
    Run.objects.filter(pk=alice_world.run.pk).update(status="succeeded", specialization="lora")
    return save_checkpoint(with_out_dir(alice_world.run, data_dir), 2)


def test_it_asks_for_the_fields_of_the_agents_environment(alice, checkpoint):
    page = alice.client.get(reverse("playground"))
    html = page.content.decode()
    assert f'value="c:{checkpoint.pk}"' in html and "base models" in html and 'name="task_question"' not in html
    fields = alice.client.get(reverse("playground"), {"agents": f"c:{checkpoint.pk}"}, headers=HX).content.decode()
    assert fields.lstrip().startswith('<div id="task-fields"') and 'name="task_question"' in fields and 'name="task_answer"' in fields
    example = alice.client.get(reverse("playground"), {"agents": f"c:{checkpoint.pk}", "example": "1"}, headers=HX).content.decode()
    assert "Compute " in example  # a generated math_tool task fills the form


def test_it_plays_a_task_side_by_side_turn_by_turn(alice, checkpoint, jobs_sent, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        response = alice.client.post(reverse("playground"), {
            "agents": f"c:{checkpoint.pk}", "task_question": "Compute 12 + 30.", "task_answer": "42",
            "temperature": "0", "max_new_tokens": "8", "with_base": "on",
        })
    job = Job.objects.get(kind="playground")
    assert response.status_code == 302 and response["Location"] == reverse("playground_job", args=[job.pk])
    assert jobs_sent == [("playground_execute", job.pk)]
    assert job.params["row"] == {"question": "Compute 12 + 30.", "answer": "42"}
    assert [lane["label"] for lane in job.result["lanes"]] == [f"Run #{checkpoint.run_id} · step 2", "Base models"]
    waiting = alice.client.get(reverse("playground_job", args=[job.pk])).content.decode()
    assert "Waiting for a worker: none is online for the gpu queue (next in the jobs lane)" in waiting and 'hx-trigger="every 1s"' in waiting

    done = jobs.playground_execute(job_id=job.pk)
    assert done.status == "succeeded", done.error
    trained, base = done.result["lanes"]
    assert [t["agent"] for t in trained["turns"]][:2] == ["tool", "reasoner"] and len(trained["turns"]) == len(base["turns"]) == 2
    first = trained["turns"][0]
    assert first["role"] == "tool" and first["tool_output"] and first["tokens"] <= 8 and "Compute 12 + 30." in first["prompt"]
    assert trained["done"] and base["done"] and trained["success"] is False
    assert trained["turns"][0]["text"] != base["turns"][0]["text"] or trained["turns"][1]["text"] != base["turns"][1]["text"]
    # each lane names what played it: the trained adapters, and the base model beside them (never "adapter ...")
    assert [t["policy"].split(" on ")[0] for t in trained["turns"]] == ["adapter tool", "adapter reasoner"]
    assert all(t["policy"] == "base model tiny-random:llama" for t in base["turns"]), base["turns"]
    partial = alice.client.get(reverse("playground_job", args=[job.pk]), headers=HX).content.decode()
    assert partial.lstrip().startswith('<div id="transcript"') and "every 1s" not in partial  # finished: polling stops
    assert partial.count('class="turn"') == 4 and "tool run" in partial and "not solved" in partial
    assert partial.count("by base model ") == 2 and partial.count("by adapter ") == 2


def test_it_saves_each_turn_as_it_is_played(alice, alice_world, jobs_sent, monkeypatch):
    """When the reasoner is asked to act, the tool's turn is already in the database (the page shows it)."""
    from training.rollout import Sampler

    job = jobs.playground_start(team=alice.team, user=alice.user, topology=alice_world.topology,
                                row={"question": "Compute 1 + 1.", "answer": "2"}, max_new_tokens=4)
    assert [lane["label"] for lane in job.result["lanes"]] == ["Base models"]
    stored_before: dict[str, list[str]] = {}
    real_sample = Sampler.sample

    def sample(self, agent, *args, **kwargs):
        stored_before[agent] = [t["agent"] for t in Job.objects.get(pk=job.pk).result["lanes"][0]["turns"]]
        return real_sample(self, agent, *args, **kwargs)

    monkeypatch.setattr(Sampler, "sample", sample)
    done = jobs.playground_execute(job_id=job.pk)
    assert done.status == "succeeded", done.error
    assert stored_before == {"tool": [], "reasoner": ["tool"]}


def test_it_explains_what_is_missing(alice, checkpoint):
    html = alice.client.post(reverse("playground"), {"agents": f"c:{checkpoint.pk}", "task_question": "  ", "temperature": "0"}).content.decode()
    assert "This field is required" in html or "Type the task" in html
    html = alice.client.post(reverse("playground"), {"agents": f"c:{checkpoint.pk}", "task_question": "[1, 2",
                                                     "temperature": "0"}).content.decode()
    assert "not valid" in html and not Job.objects.exists()


def test_it_keeps_teams_apart(alice, bob, checkpoint, jobs_sent):
    assert f"c:{checkpoint.pk}" not in bob.client.get(reverse("playground")).content.decode()
    response = bob.client.post(reverse("playground"), {"agents": f"c:{checkpoint.pk}", "task_question": "hi", "temperature": "0"})
    assert "Pick agents from the list" in response.content.decode() and not Job.objects.exists()
    job = jobs.playground_start(team=alice.team, user=alice.user, checkpoint=checkpoint, row={"question": "q", "answer": ""})
    assert bob.client.get(reverse("playground_job", args=[job.pk])).status_code == 404


def test_it_offers_only_checkpoints_still_on_disk(alice, checkpoint):
    import shutil

    shutil.rmtree(checkpoint.path)  # what checkpoint.keep does to older checkpoints
    assert f'value="c:{checkpoint.pk}"' not in alice.client.get(reverse("playground")).content.decode()
    html = alice.client.post(reverse("playground"), {"agents": f"c:{checkpoint.pk}", "task_question": "Compute 1 + 1.",
                                                     "task_answer": "2", "temperature": "0"}).content.decode()
    assert "no longer on disk" in html and not Job.objects.exists()
