"""Held-out evaluation on the run page: the engine's evaluations (step 0 and later) as a table and
a chart per agent, and "evaluate this checkpoint on dataset X": a job on the `gpu` queue that
calls `training.evaluation.evaluate_checkpoint` with the run's config pointed at X; its result
appears on the run page."""

from __future__ import annotations

import json

import pytest
import yaml
from django.urls import reverse

from tests.webapp.history_helpers import add_evaluations, held_out_episode, save_checkpoint, with_out_dir
from webapp.jobs import services as jobs
from webapp.models import Dataset, Job, Run

HX = {"HX-Request": "true"}


@pytest.fixture
def run(alice, alice_world, data_dir) -> Run:
    """A finished tiny run with short completions and a checkpoint at step 3."""
    config = alice_world.run.to_config().replace(**{"generation.max_new_tokens": 6, "lora.r": 2})
    Run.objects.filter(pk=alice_world.run.pk).update(config_yaml=config.to_yaml(), status="succeeded", environment="math_tool")
    run = with_out_dir(alice_world.run, data_dir)
    save_checkpoint(run, 3)
    return run


@pytest.fixture
def level2(alice) -> Dataset:
    return Dataset.objects.create(team=alice.team, name="math L2", kind="generator", environment="math_tool",
                                  env_args={"level": 2}, size=8, eval_size=3, row_count=11)


def test_it_shows_the_engines_evaluations_as_a_table_and_a_chart(alice, run):
    add_evaluations(run, [(0, 0.25, {"tool": 0.5, "reasoner": 0.25}), (3, 0.75, {"tool": 1.0, "reasoner": 0.75})])
    html = alice.client.get(run.get_absolute_url()).content.decode()
    assert 'id="held-out"' in html and 'id="eval-table"' in html and "evaluations.js" in html
    assert "step 0 25% → step 3 75%" in html and 'class="delta up">(+50 pts)' in html
    chart = json.loads(html.split('id="eval-chart-data" type="application/json">')[1].split("</script>")[0])
    assert chart == {"steps": [0, 3], "series": {"team": [0.25, 0.75], "tool": [0.5, 1.0], "reasoner": [0.25, 0.75]}}


def test_it_queues_an_evaluation_on_another_dataset(alice, run, level2, jobs_sent, django_capture_on_commit_callbacks):
    checkpoint = run.checkpoints.get()
    with django_capture_on_commit_callbacks(execute=True):
        html = alice.client.post(reverse("run_evaluate", args=[run.pk]), {"checkpoint": checkpoint.pk, "dataset": level2.pk},
                                 headers=HX).content.decode()
    job = Job.objects.get()
    assert jobs_sent == [("evaluation_execute", job.pk)]
    assert job.kind == "evaluate" and job.checkpoint == checkpoint and job.dataset == level2 and job.owner == alice.user
    config = yaml.safe_load(job.params["config_yaml"])
    assert config["topology"]["env_args"]["level"] == 2 and config["data"]["eval_size"] == 3 and config["eval"]["size"] == 3
    assert html.lstrip().startswith('<div id="eval-panel"') and "Queued" in html and 'hx-trigger="every 2s"' in html


def test_it_refuses_a_dataset_of_another_environment(alice, run):
    other = Dataset.objects.create(team=alice.team, name="arith", kind="generator", environment="arithmetic", size=4, eval_size=2)
    html = alice.client.post(reverse("run_evaluate", args=[run.pk]), {"dataset": other.pk}, headers=HX).content.decode()
    assert "Select a valid choice" in html and not Job.objects.exists()
    with pytest.raises(Exception, match="arithmetic dataset"):
        jobs.evaluation_request(run=run, user=alice.user, dataset=other, checkpoint=None)


def test_it_evaluates_for_real_and_shows_the_result(alice, run, level2, jobs_sent):
    job = jobs.evaluation_request(run=run, user=alice.user, dataset=level2, checkpoint=run.checkpoints.get())
    done = jobs.evaluation_execute(job_id=job.pk)
    assert done.status == "succeeded", done.error
    (result,) = done.result["evaluations"]
    assert result["n"] == 3 and result["step"] == 3 and set(result["agents"]) == {"tool", "reasoner"}
    assert jobs.evaluation_execute(job_id=job.pk) is None  # a redelivered task finds it claimed
    html = alice.client.get(reverse("run_evaluate", args=[run.pk]), headers=HX).content.decode()
    assert "Succeeded" in html and "math L2" in html and "step 3" in html and "every 2s" not in html


def test_it_evaluates_the_base_models_and_records_failures(alice, run, level2, jobs_sent):
    seen = []
    base = jobs.evaluation_request(run=run, user=alice.user, dataset=level2, checkpoint=None)
    jobs.evaluation_execute(job_id=base.pk, evaluate=lambda config, checkpoint: seen.append(checkpoint) or [{"step": 0, "n": 3}])
    assert seen == [None] and Job.objects.get(pk=base.pk).status == "succeeded"
    broken = jobs.evaluation_request(run=run, user=alice.user, dataset=level2, checkpoint=None)

    def boom(config, checkpoint):
        raise RuntimeError("CUDA out of memory")

    failed = jobs.evaluation_execute(job_id=broken.pk, evaluate=boom)
    assert failed.status == "failed" and failed.error == "RuntimeError: CUDA out of memory"


def test_it_hides_another_teams_run(bob, run, level2):
    assert bob.client.post(reverse("run_evaluate", args=[run.pk]), {"dataset": level2.pk}).status_code == 404
    assert bob.client.get(reverse("run_evaluate", args=[run.pk]), headers=HX).status_code == 404


def test_a_finished_evaluation_job_keeps_every_episode_and_the_run_page_links_them(alice, bob, run, level2, jobs_sent):
    """Every episode an evaluation job played is kept on its own rows (its result keeps the numbers
    and 3 examples); the run page's job table links them, filtered by outcome and agent, paged;
    a queued job's page says it has none yet; a job of another run, or another team, is not found."""
    from webapp.runs.rollouts import EVALUATION_PAGE

    n = EVALUATION_PAGE + 3

    job = jobs.evaluation_request(run=run, user=alice.user, dataset=level2, checkpoint=run.checkpoints.get())
    url = reverse("run_job_episodes", args=[run.pk, job.pk])
    queued = alice.client.get(url).content.decode()
    assert "No episodes yet: the job is queued" in queued and url not in alice.client.get(run.get_absolute_url()).content.decode()
    done = jobs.evaluation_execute(job_id=job.pk, evaluate=lambda config, checkpoint: [
        {"step": 3, "temperature": 0.0, "n": n, "team": {"success": 12 / n}, "agents": {"tool": {"success": 0.5}},
         "episodes": [held_out_episode(i, solved_every=3) for i in range(n)]}])
    assert done.status == "succeeded" and done.episodes.count() == n
    (result,) = done.result["evaluations"]
    assert "episodes" not in result and len(result["examples"]) == jobs.JOB_EXAMPLES  # the job's row stays small
    assert url in alice.client.get(run.get_absolute_url()).content.decode()

    html = alice.client.get(url).content.decode()
    assert f"Evaluation job #{job.pk}: step 3 on math L2" in html and "page 1 of 2" in html
    assert html.count('class="episode ') == EVALUATION_PAGE and f"answer of task {EVALUATION_PAGE} by" not in html
    assert alice.client.get(url, {"page": 2}).content.decode().count('class="episode ') == 3
    solved = alice.client.get(url, {"success": "yes"}).content.decode()
    assert solved.count('class="episode ') == 12 and "answer of task 1 by" not in solved
    tool = alice.client.get(url, {"agent": "tool", "success": "no"}).content.decode()
    assert tool.count('class="episode ') == len([i for i in range(n) if i % 2 and i % 3]) and "answer of task 3 by" not in tool

    # a job finished before every episode was kept: the 3 examples its result stored
    Job.objects.filter(pk=job.pk).update(result={"evaluations": [{**result, "examples": [held_out_episode(0, solved_every=3), held_out_episode(1, solved_every=3)]}]})
    done.episodes.all().delete()
    older = alice.client.get(url).content.decode()
    assert older.count('class="episode ') == 2 and f"2 of its {n} are shown" in older

    Job.objects.filter(pk=job.pk).update(status="failed", error="RuntimeError: CUDA out of memory", result={})
    failed = alice.client.get(url).content.decode()
    assert "The job failed (RuntimeError: CUDA out of memory)" in failed and "No episodes: the job failed." in failed
    other = Run.objects.create(team=alice.team, name="other", status="succeeded", config_yaml=run.config_yaml)
    assert alice.client.get(reverse("run_job_episodes", args=[other.pk, job.pk])).status_code == 404
    assert bob.client.get(url).status_code == 404
