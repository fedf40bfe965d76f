"""A warm start and an evaluation asked several times at the same moment (a double click, two tabs,
a script) make one run or one job (issue 45, class 6 leftover): each looks for the same request
queued or running and inserts under the source run's row lock, as Resume does
(test_concurrent_clicks_make_one.py). Run on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest

from tests.webapp.jobs.test_evaluation_jobs import level2, run  # noqa: F401 - fixtures
from tests.webapp.runs.test_concurrent_clicks_make_one import clients_of, together
from tests.webapp.runs.test_run_warm_start import finished  # noqa: F401 - a fixture
from webapp.jobs import services as jobs
from webapp.models import Dataset, Job, Run
from webapp.runs.warmstart import warm_start_launch

pytestmark = pytest.mark.django_db(transaction=True)


def test_warm_starts_asked_together_make_one_dataset_and_one_run(alice, finished, enqueued):  # noqa: F811
    answers = together(clients_of(alice), lambda _: warm_start_launch(run=finished, user=alice.user, steps=2).pk)
    runs = list(Run.objects.filter(team=alice.team, algorithm="sft"))
    assert len(runs) == 1 and set(answers) == {runs[0].pk} and enqueued == [runs[0].pk]
    assert Dataset.objects.filter(team=alice.team, kind=Dataset.Kind.CHATS).count() == 1


def test_evaluations_asked_together_make_one_job(alice, run, level2, jobs_sent):  # noqa: F811
    checkpoint = run.checkpoints.get()
    answers = together(clients_of(alice, 8), lambda _: jobs.evaluation_request(run=run, user=alice.user, dataset=level2,
                                                                               checkpoint=checkpoint).pk)
    (job,) = Job.objects.filter(run=run, kind=Job.Kind.EVALUATE)
    assert set(answers) == {job.pk} and jobs_sent == [("evaluation_execute", job.pk)]
    # another checkpoint or dataset is another evaluation; the same one, once done, may be asked again
    assert jobs.evaluation_request(run=run, user=alice.user, dataset=level2, checkpoint=None).pk != job.pk
    Job.objects.filter(pk=job.pk).update(status=Job.Status.SUCCEEDED)
    assert jobs.evaluation_request(run=run, user=alice.user, dataset=level2, checkpoint=checkpoint).pk != job.pk
