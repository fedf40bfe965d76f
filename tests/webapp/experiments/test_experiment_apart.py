"""Trained apart from the experiment page: an experiment whose arms freeze complementary agents
(one trains the tool with the reasoner frozen, the other the reasoner with the tool frozen) offers
"trained apart"; one click teams each seed's two finished trials (the frozen agents act with the
weights the partner trained) as one evaluation job, which runs on the tiny model and lands as a
row under the first arm. A trial without its partner is named, not silently skipped."""

from __future__ import annotations

import pytest
from django.urls import reverse

from tests.webapp.experiments.helpers import launch, trials
from tests.webapp.history_helpers import save_checkpoint, with_out_dir
from webapp.jobs import services as jobs
from webapp.jobs.ablations import ablation_request
from webapp.models import Job, Run


@pytest.fixture
def apart(alice, alice_world, data_dir):
    """An experiment of two arms x one seed: the tool trained (reasoner frozen), then the reasoner."""
    base = alice_world.run.to_config().to_dict()["topology"]["agents"]
    arms = [[{**a, "trainable": a["name"] == trained} for a in base] for trained in ("tool", "reasoner")]
    experiment = launch(alice, alice_world, axes={"topology.agents": arms}, seeds=[0], name="apart")
    return experiment, trials(experiment)


def finished(run: Run, data_dir) -> Run:
    """The trial succeeded, small enough to evaluate here, with a real checkpoint at step 2."""
    config = run.to_config().replace(**{"generation.max_new_tokens": 4, "lora.r": 2, "eval.size": 2, "data.eval_size": 2})
    Run.objects.filter(pk=run.pk).update(config_yaml=config.to_yaml(), status="succeeded", step=2)
    run = with_out_dir(run, data_dir)
    save_checkpoint(run, 2)
    return run


def test_trained_apart_teams_each_seeds_two_trials_and_its_row_lands_under_the_first_arm(alice, apart, data_dir, jobs_sent):
    experiment, (tool_trained, reasoner_trained) = apart
    page = alice.client.get(experiment.get_absolute_url()).content.decode()
    assert '<option value="apart">trained apart</option>' in page

    tool_trained = finished(tool_trained, data_dir)
    response = alice.client.post(reverse("experiment_ablate", args=[experiment.pk]), {"ablation": "apart"}, follow=True)
    assert (f"trial 0 (run #{tool_trained.pk}): no finished trial of its seed trained exactly the agents it froze"
            in response.content.decode()), "a trial without its partner is named"
    assert not Job.objects.exists()

    reasoner_trained = finished(reasoner_trained, data_dir)
    alice.client.post(reverse("experiment_ablate", args=[experiment.pk]), {"ablation": "apart"})
    job = Job.objects.get()  # one job for the pair, on its first trial
    assert job.run_id == tool_trained.pk and job.params["ablation"] == "apart"
    assert job.params["partner_run"] == reasoner_trained.pk and job.params["partner_agents"] == ["reasoner"]
    alice.client.post(reverse("experiment_ablate", args=[experiment.pk]), {"ablation": "apart"})
    assert Job.objects.count() == 1, "asked again: the same job"

    seen = {}

    def spy(config, checkpoint, *, ablation, partner=None):
        seen.update(checkpoint=checkpoint, ablation=ablation, partner=partner)
        return jobs._evaluate_ablation(config, checkpoint, ablation=ablation, partner=partner)  # the real one, tiny model

    done = jobs.evaluation_execute(job_id=job.pk, evaluate=spy)
    assert done.status == "succeeded", done.error
    partner_folder = reasoner_trained.checkpoints.get().path
    assert seen["ablation"] == "apart" and seen["partner"].endswith(partner_folder.split("/runs/")[-1])
    assert seen["checkpoint"].endswith(tool_trained.checkpoints.get().path.split("/runs/")[-1])
    (result,) = done.result["evaluations"]
    assert result["ablation"]["label"] == "trained apart" and result["partner"] == seen["partner"] and result["n"] == 2

    page = alice.client.get(experiment.get_absolute_url()).content.decode()
    assert page.count('data-ablation="apart"') == 1, "the pair's one row, under the first arm"


def test_trained_apart_is_refused_without_a_partner_and_with_one_that_does_not_fit(alice, apart, data_dir):
    experiment, (tool_trained, reasoner_trained) = apart
    tool_trained, reasoner_trained = finished(tool_trained, data_dir), finished(reasoner_trained, data_dir)
    with pytest.raises(Exception, match="trained apart teams two trials: ablate it from their experiment's page"):
        ablation_request(run=tool_trained, user=alice.user, key="apart")
    with pytest.raises(Exception, match="cannot be the partner: the partner must train exactly the agents this run froze"):
        ablation_request(run=tool_trained, user=alice.user, key="apart", partner=_same_arm_copy(tool_trained))
    Run.objects.filter(pk=reasoner_trained.pk).update(status="failed")
    with pytest.raises(Exception, match=f"the partner run #{reasoner_trained.pk} has not succeeded"):
        ablation_request(run=tool_trained, user=alice.user, key="apart", partner=Run.objects.get(pk=reasoner_trained.pk))
    assert not Job.objects.exists()


def _same_arm_copy(run: Run) -> Run:
    """Another succeeded run with the same config (it trained the tool too: no partner)."""
    return Run.objects.create(team=run.team, name="twin", topology=run.topology, dataset=run.dataset, config_yaml=run.config_yaml,
                              total_steps=2, status="succeeded")


def test_every_view_of_an_experiment_whose_arms_are_lists_of_agents_answers(alice, apart):
    """An axis over `topology.agents` makes each arm's value a list of dicts: the learning curves
    keyed arms by that value, which cannot be hashed, and answered 500 ("Could not load the curves")."""
    from tests.webapp.api.test_api import Api
    from tests.webapp.experiments.helpers import finish
    from webapp.teams import services as tokens

    experiment, runs = apart
    for run in runs:
        finish(run, 0.5)
    curves = alice.client.get(reverse("experiment_curves", args=[experiment.pk]))
    assert curves.status_code == 200 and [len(arm["steps"]) for arm in curves.json()["arms"]] == [2, 2]
    assert "trainable: false" in curves.json()["arms"][0]["label"]
    assert alice.client.get(reverse("experiment_export", args=[experiment.pk])).status_code == 200
    assert alice.client.get(experiment.get_absolute_url()).status_code == 200
    api = Api(tokens.api_token_create(user=alice.user, team=alice.team, name="notebook")[1])
    detail = api.get(f"/api/v1/experiments/{experiment.pk}/")
    assert detail.status_code == 200 and len(detail.json()["arms"]) == 2
