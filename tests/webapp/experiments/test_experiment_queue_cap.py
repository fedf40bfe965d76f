"""Fair share: a team runs at most TROUPE_EXPERIMENT_CONCURRENCY experiment trials at once. Its
further trials are held in the queue (and shown as held) while other runs, its own included, go
past them; when a trial ends, a held one gets a message and starts."""

from __future__ import annotations

from django.urls import reverse

from tests.webapp.conftest import FakeResult
from tests.webapp.experiments.helpers import launch, trials
from webapp.models import Run
from webapp.runs import queue
from webapp.runs import services as run_services


def test_trials_past_the_cap_are_held_while_other_runs_start(alice, alice_world, bob, bob_world, settings):
    settings.TROUPE_EXPERIMENT_CONCURRENCY = 2
    Run.objects.filter(pk__in=[alice_world.run.pk, bob_world.run.pk]).update(status="succeeded")
    experiment = launch(alice, alice_world, seeds=[0, 1])  # 4 trials, queued before the runs below
    plain = run_services.run_create(team=alice.team, user=alice.user, name="plain", config=alice_world.run.to_config())
    other = run_services.run_create(team=bob.team, user=bob.user, name="bob's", config=bob_world.run.to_config())
    runs = trials(experiment)
    claimed = [queue.run_claim_next(worker="w") for _ in range(4)]
    assert [r.pk for r in claimed] == [runs[0].pk, runs[1].pk, plain.pk, other.pk]
    assert queue.run_claim_next(worker="w") is None  # only held trials are left
    assert queue.experiment_capped_teams() == [alice.team.pk]
    dashboard = alice.client.get(reverse("dashboard")).content.decode()
    assert dashboard.count("held: your team already runs 2 experiment trials") == 2
    page = alice.client.get(experiment.get_absolute_url()).content.decode()
    assert "Your team runs at most 2 experiment trials at once (2 running now)" in page and "(held)" in page


def test_a_trial_that_ends_sends_a_message_for_the_next_held_one(alice, alice_world, enqueued, settings):
    settings.TROUPE_EXPERIMENT_CONCURRENCY = 1
    Run.objects.filter(pk=alice_world.run.pk).update(status="succeeded")
    experiment = launch(alice, alice_world, seeds=[0])
    first, second = trials(experiment)
    Run.objects.filter(pk=first.pk).update(status="running")
    assert queue.run_claim_next(worker="w") is None  # held
    Run.objects.filter(pk=first.pk).update(status="queued")
    done = run_services.run_execute(worker="w", train=lambda config, *, out_dir, sink: FakeResult(status="succeeded", step=2))
    assert done.pk == first.pk and done.status == "succeeded"
    assert enqueued == [second.pk]
    assert run_services.run_execute(worker="w", train=lambda config, *, out_dir, sink: FakeResult(status="succeeded", step=2)).pk == second.pk
