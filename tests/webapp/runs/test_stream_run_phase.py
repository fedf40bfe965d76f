"""What a running run is doing now (the engine's `status` events) reaches the run page: kept on the
run for a page opened later, streamed to an open page, said once in the run's log, and cleared when
the run ends; the page's other parts refresh with the run's state, not at the next reload."""

from __future__ import annotations

import time
from pathlib import Path

from django.urls import reverse

from tests.webapp.streams import TRANSACTIONAL, Worker, by_type, orm, receive_backlog, receive_until, run, socket
from webapp.models import Checkpoint, Evaluation, LogLine, Run
from webapp.runs.sink import DatabaseSink

pytestmark = TRANSACTIONAL
ROOT = Path(__file__).resolve().parents[3]


def test_it_keeps_the_phase_on_the_run_and_logs_each_new_one_once(alice_world):
    Run.objects.filter(pk=alice_world.run.pk).update(status="running")
    sink = DatabaseSink(alice_world.run)
    sink.status("loading", "Loading tiny-random:llama (lora policies)")
    for done in (0, 2, 4):
        sink.status("evaluating", f"Evaluating at step 0: {done}/4 held-out tasks", progress=done / 4, eta=None)
    sink.status("training", "Training step 1 of 3", eta=30.0)
    before = time.time()
    sink.status("training", "Training step 2 of 3", eta=20.0)
    after = time.time()
    run_row = Run.objects.get(pk=alice_world.run.pk)
    assert (run_row.phase, run_row.phase_detail, run_row.phase_progress) == ("training", "Training step 2 of 3", None)
    assert before + 20 - 1e-3 <= run_row.eta.timestamp() <= after + 20 + 1e-3  # 20 s after it was said, however long that took
    assert list(LogLine.objects.filter(run=run_row).order_by("id").values_list("message", flat=True)) == [
        "Loading tiny-random:llama (lora policies)", "Evaluating at step 0: 0/4 held-out tasks"]
    sink.finish(status="succeeded", step=3)
    run_row.refresh_from_db()
    assert (run_row.phase, run_row.phase_detail, run_row.phase_progress, run_row.eta) == ("", "", None, None)


def test_an_open_page_hears_the_phase_and_a_late_one_reads_it(alice, alice_world):
    worker = Worker(alice_world.run)

    async def scenario():
        await worker.started(total=3)
        ws = socket(alice_world.run.pk, alice.client)
        assert (await ws.connect())[0]
        await receive_backlog(ws)
        await orm(worker.sink.status, "evaluating", "Evaluating at step 0: 25/100 held-out tasks", progress=0.25, eta=None)
        live = await receive_until(ws, "phase")
        phase = by_type(live, "phase")
        assert phase == [{"t": "phase", "phase": "evaluating", "detail": "Evaluating at step 0: 25/100 held-out tasks",
                          "progress": 0.25, "eta": None}]
        before = time.time()
        await orm(worker.sink.status, "training", "Training step 1 of 3", eta=90.0)
        after = time.time()
        eta = by_type(await receive_until(ws, "phase"), "phase")[0]["eta"]
        assert before + 90 - 1e-3 <= eta <= after + 90 + 1e-3  # when the run should end, for the page to count down
        await ws.disconnect()

        late = socket(alice_world.run.pk, alice.client)
        assert (await late.connect())[0]
        status = by_type(await receive_backlog(late), "status")[0]
        assert (status["phase"], status["detail"]) == ("training", "Training step 1 of 3") and abs(status["eta"] - eta) < 0.01
        await late.disconnect()

    run(scenario)


def test_an_open_page_hears_where_a_run_on_several_hosts_was_placed(alice, alice_world):
    """The Hosts line is in the summary card, which refreshes on status changes and steps: the
    `placed` event must reach the page as well, or it says "not granted yet" while its ranks start."""
    worker = Worker(alice_world.run)

    async def scenario():
        await worker.started(total=3)
        ws = socket(alice_world.run.pk, alice.client)
        assert (await ws.connect())[0]
        await receive_backlog(ws)
        await orm(worker.sink.placed, {"launcher": "ray", "hosts": 2, "ranks": 2, "resource": "CPU", "nodes": {"alpha": 1, "bravo": 1}})
        assert by_type(await receive_until(ws, "placed"), "placed") == [{"t": "placed"}]
        await ws.disconnect()

    run(scenario)  # what an open page does with it (one summary read per grant): tests/browser/test_run_page_grant.py


def test_the_page_renders_the_phase_and_refreshes_its_other_parts(alice, alice_world):
    run_row = alice_world.run
    Run.objects.filter(pk=run_row.pk).update(status="running", phase="evaluating", phase_progress=0.5,
                                              phase_detail="Evaluating at step 0: 50/100 held-out tasks")
    page = alice.client.get(reverse("run_detail", args=[run_row.pk])).content.decode()
    assert 'id="run-phase"' in page and "Evaluating at step 0: 50/100 held-out tasks" in page and 'value="50"' in page
    # before any result, the held-out card says the evaluation is under way (not "none recorded yet")
    assert 'id="held-out-note" data-empty="1">Evaluating at step 0: 50/100 held-out tasks' in page

    Evaluation.objects.create(run=run_row, step=0, team_success=0.25, agents={"tool": {"success": 0.5, "reward": 0.1}},
                              data={"n": 100})
    Checkpoint.objects.create(run=run_row, step=3, path="/nowhere/step-000003")
    Run.objects.filter(pk=run_row.pk).update(status="succeeded", phase="", phase_detail="")
    refresh = alice.client.get(reverse("run_detail", args=[run_row.pk]), {"parts": "actions,held-out,artifacts,eval-panel,bogus"},
                               headers={"HX-Request": "true"}).content.decode()
    assert refresh.lstrip().startswith('<section id="run-summary"')
    for part in ("run-actions", "held-out-results", "artifacts-body", "eval-panel"):
        assert f'id="{part}" hx-swap-oob="true"' in refresh, part
    assert "greedy team success: step 0 25%" in refresh and "none recorded yet" not in refresh
    assert "Try in playground" in refresh and ">Archive</button>" in refresh and ">Stop</button>" not in refresh
    assert 'id="run-phase" class="phase" aria-live="polite" hx-preserve="true" hidden' in refresh
    plain = alice.client.get(reverse("run_detail", args=[run_row.pk]), headers={"HX-Request": "true"}).content.decode()
    assert "hx-swap-oob" not in plain  # the summary alone


def test_a_run_state_message_carries_the_state_it_is_true_in(alice, alice_world):
    response = alice.client.post(reverse("run_cancel", args=[alice_world.run.pk]), follow=True)
    assert "Cancelled." in response.content.decode()  # a queued run: cancelled at once, true for good
    running = Run.objects.create(team=alice_world.run.team, owner=alice.user, name="r", config_yaml=alice_world.run.config_yaml,
                                 status="running")
    page = alice.client.post(reverse("run_cancel", args=[running.pk]), follow=True).content.decode()
    assert '<li class="while-running info">Asked the run to stop' in page  # run-live.js drops it once the run is no longer running
