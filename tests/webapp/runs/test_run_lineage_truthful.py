"""What a run's lineage says is true (issue 46, class 1): a resumed run offers no second Resume but a
link to the run that continued it, and the service refuses a second fork of the same checkpoint; a
resume that stopped before its own checkpoint can be resumed from the one it started from; a resumed
run's held-out evaluations include the original's up to the resume, as its charts do."""

from __future__ import annotations

from django.urls import reverse

from webapp.models import Checkpoint, Evaluation, Run


def _evaluate(run: Run, step: int, success: float) -> None:
    Evaluation.objects.create(run=run, step=step, temperature=0.0, team_success=success,
                              agents={"tool": {"success": success, "reward": success}}, data={"n": 8})


def test_it_offers_one_resume_and_then_the_link(alice, bob, alice_world, enqueued):
    run = alice_world.run
    Run.objects.filter(pk=run.pk).update(status="cancelled")
    Checkpoint.objects.create(run=run, step=13, path="/tmp/ck/step-000013")
    alice.client.post(reverse("run_resume", args=[run.pk]))
    first = Run.objects.get(resumed_from=run)
    Run.objects.filter(pk=first.pk).update(status="failed")  # the resume stopped too, before a checkpoint of its own

    page = alice.client.get(run.get_absolute_url()).content.decode()
    assert "Resume from step" not in page
    assert f'id="continued-by" href="{first.get_absolute_url()}"' in page and f"Continued in #{first.pk}" in page

    response = alice.client.post(reverse("run_resume", args=[run.pk]), follow=True)  # a second member's stale page
    assert f"Run #{run.pk} was already resumed as run #{first.pk}" in response.content.decode()
    assert Run.objects.filter(resumed_from=run).count() == 1

    # the failed resume offers Resume from the checkpoint it started from, and continues the lineage
    assert "Resume from step 13" in alice.client.get(first.get_absolute_url()).content.decode()
    alice.client.post(reverse("run_resume", args=[first.pk]))
    second = Run.objects.get(resumed_from=first)
    assert second.to_config().checkpoint.resume_from == "/tmp/ck/step-000013" and second.resumed_at_step == 13


def test_a_resumed_run_lists_the_original_evaluations(alice, alice_world):
    run = alice_world.run
    Run.objects.filter(pk=run.pk).update(status="cancelled")
    for step, success in ((0, 0.0), (10, 0.25), (20, 0.5)):
        _evaluate(run, step, success)  # step 20 came after the checkpoint the resume continues from
    child = Run.objects.create(team=run.team, name="r", config_yaml=run.config_yaml, resumed_from=run, resumed_at_step=13,
                               status="succeeded")
    _evaluate(child, 30, 0.75)
    page = alice.client.get(child.get_absolute_url()).content.decode()
    table = page[page.index('id="eval-table"'):page.index("</table>", page.index('id="eval-table"'))]
    assert [int(cell.split("<")[0]) for cell in table.split("<tr><td>")[1:]] == [0, 10, 30]  # no step 20: it came after the resumed checkpoint
    assert f'href="{run.get_absolute_url()}" title="Evaluated by the run this one resumes">(#{run.pk})</a>' in table
    assert "step 0 0%" in page and "step 30 75%" in page  # the headline spans the lineage
