"""Ablations as buttons on a finished team run: each button queues an evaluation job labelled as
the ablation (role swap, untrained team, an agent alone), executed here in-process with the tiny
model; the result lands beside the run's evaluations. The API does the same."""

from __future__ import annotations

import json

import pytest
from django.urls import reverse

from agents.envs.math_tool import MathTool
from tests.webapp.api.test_api import Api
from tests.webapp.history_helpers import save_checkpoint, with_out_dir
from webapp.jobs import services as jobs
from webapp.models import Job, Run
from webapp.teams import services as tokens


@pytest.fixture
def run(alice, alice_world, data_dir) -> Run:
    """A finished two-agent lora run (tiny model, short completions, 2 held-out tasks) with a checkpoint at step 3."""
    config = alice_world.run.to_config().replace(**{"generation.max_new_tokens": 4, "lora.r": 2, "eval.size": 2, "data.eval_size": 2})
    Run.objects.filter(pk=alice_world.run.pk).update(config_yaml=config.to_yaml(), status="succeeded", environment="math_tool")
    run = with_out_dir(alice_world.run, data_dir)
    save_checkpoint(run, 3)
    return run


def test_a_finished_team_run_offers_each_ablation_as_a_button(alice, run):
    html = alice.client.get(run.get_absolute_url()).content.decode()
    buttons = [chunk.split('"')[0] for chunk in html.split('data-ablation="')[1:]]
    assert buttons == ["role_swap", "untrained", "alone:tool", "alone:reasoner"]
    assert ">Role swap</button>" in html and ">Tool alone</button>" in html
    Run.objects.filter(pk=run.pk).update(status="running")
    assert 'data-ablation="' not in alice.client.get(run.get_absolute_url()).content.decode()


def test_the_role_swap_button_runs_a_job_whose_result_lands_beside_the_evaluations(
        alice, run, jobs_sent, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        response = alice.client.post(reverse("run_ablate", args=[run.pk]), {"ablation": "role_swap"}, follow=True)
    job = Job.objects.get()
    assert jobs_sent == [("evaluation_execute", job.pk)]
    assert job.kind == "evaluate" and job.checkpoint.step == 3 and job.params["ablation"] == "role_swap"
    assert "Ablation role swap queued" in response.content.decode()

    done = jobs.evaluation_execute(job_id=job.pk)  # what the worker's task calls
    assert done.status == "succeeded", done.error
    (result,) = done.result["evaluations"]
    assert result["ablation"]["label"] == "role swap" and result["step"] == 3 and result["n"] == 2
    assert {t["policy"] for ep in result["examples"] for t in ep["turns"] if t["agent"] == "tool"} == {"adapter reasoner on tiny-random:llama"}
    episodes = alice.client.get(reverse("run_job_episodes", args=[run.pk, job.pk])).content.decode()
    assert done.episodes.count() == 2 and episodes.count('class="episode ') == 2 and "role swap" in episodes
    assert "by adapter reasoner on tiny-random:llama" in episodes  # each task as the swapped team played it
    html = alice.client.get(reverse("run_evaluate", args=[run.pk]), headers={"HX-Request": "true"}).content.decode()
    assert 'class="ablation-label">role swap</strong>' in html and "Succeeded" in html

    with django_capture_on_commit_callbacks(execute=True):  # asked again: the same job, not a second one
        alice.client.post(reverse("run_ablate", args=[run.pk]), {"ablation": "role_swap"})
    assert Job.objects.count() == 1


def test_the_untrained_team_needs_no_checkpoint_and_an_agent_alone_plays_by_itself(alice, run, jobs_sent):
    from webapp.jobs.ablations import ablation_request

    untrained = ablation_request(run=run, user=alice.user, key="untrained")
    assert untrained.checkpoint is None and untrained.params["checkpoint_step"] is None
    alone = jobs.evaluation_execute(job_id=ablation_request(run=run, user=alice.user, key="alone:reasoner").pk)
    assert alone.status == "succeeded", alone.error
    assert set(alone.result["evaluations"][0]["agents"]) == {"reasoner"}


def test_it_refuses_an_agent_alone_where_the_environment_does_not_allow_it(alice, run, monkeypatch):
    monkeypatch.setattr(MathTool, "solo_roles", ("tool",))
    response = alice.client.post(reverse("run_ablate", args=[run.pk]), {"ablation": "alone:reasoner"}, follow=True)
    assert "math_tool: the reasoner role cannot act alone; only tool can" in response.content.decode()
    assert not Job.objects.exists()
    html = alice.client.get(run.get_absolute_url()).content.decode()
    assert 'data-ablation="alone:tool"' in html and 'data-ablation="alone:reasoner"' not in html


def test_the_api_queues_an_ablation_and_names_what_it_refuses(alice, run, jobs_sent):
    api = Api(tokens.api_token_create(user=alice.user, team=alice.team, name="notebook")[1])
    url = f"/api/v1/runs/{run.pk}/ablations/"
    listed = api.get(url).json()
    assert [a["key"] for a in listed["available"]] == ["role_swap", "untrained", "alone:tool", "alone:reasoner"]
    response = api.post(url, json.dumps({"ablation": "untrained"}), content_type="application/json")
    assert response.status_code == 202 and response.json()["kind"] == "evaluate"
    assert api.get(url).json()["jobs"][0]["ablation"] == "untrained"
    bad = api.post(url, json.dumps({"ablation": "alone:nobody"}), content_type="application/json")
    assert bad.status_code == 400 and "no acting agent 'nobody'" in bad.json()["fields"]["ablation"][0]
    assert "/api/v1/runs/{id}/ablations/" in api.get("/api/v1/openapi.json").json()["paths"]
