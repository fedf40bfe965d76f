"""A team member using the shared history in Chromium, against Daphne and a real Celery worker
(tiny random model): find runs with the filters, tag and annotate one in place, compare two
(curves, held-out table, config diff), evaluate a checkpoint on another dataset, export a merged
model, play a task in the playground beside the base models, and call the API with a token.

Screenshots go to $TROUPE_SCREENSHOTS (or the test's tmp folder): history-*.png."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.browser.conftest import Member, TinyWorld
from tests.browser.test_run_live import log_in
from tests.processes import Processes
from tests.webapp.history_helpers import add_evaluations, add_metrics, save_checkpoint, with_out_dir
from webapp.models import Dataset, Job, Run, Tag
from webapp.runs import services as run_services

pytestmark = pytest.mark.django_db(transaction=True)


def finished_run(world: TinyWorld, member: Member, data_dir: Path, *, name: str, lr: float, slope: float,
                 held_out: tuple[float, float]) -> Run:
    config = run_services.run_config_build(topology=world.topology, dataset=world.dataset, name=name, overrides={
        "optim.steps": 40, "optim.lr": lr, "generation.max_new_tokens": 6, "lora.r": 2, "eval.every": 20})
    run = Run.objects.create(team=world.team, owner=member.user, name=name, topology=world.topology, dataset=world.dataset,
                             config_yaml=config.to_yaml(), status=Run.Status.SUCCEEDED, environment="math_tool",
                             specialization="lora")
    run = with_out_dir(run, data_dir)
    add_metrics(run, 40, slope=slope)
    add_evaluations(run, [(0, held_out[0], {"tool": held_out[0], "reasoner": held_out[0] / 2}),
                          (20, (held_out[0] + held_out[1]) / 2, {"tool": held_out[1] * 0.8, "reasoner": held_out[1] / 2}),
                          (40, held_out[1], {"tool": held_out[1], "reasoner": held_out[1] * 0.7})])
    save_checkpoint(run, 40)
    return run


@pytest.fixture
def history(tiny_world: TinyWorld, alice: Member, data_dir: Path) -> dict[str, Any]:
    a = finished_run(tiny_world, alice, data_dir, name="lora lr 1e-4", lr=1e-4, slope=0.01, held_out=(0.1, 0.45))
    b = finished_run(tiny_world, alice, data_dir, name="lora lr 1e-3", lr=1e-3, slope=0.02, held_out=(0.1, 0.2))
    c = Run.objects.create(team=tiny_world.team, owner=alice.user, name="crashed early", topology=tiny_world.topology,
                           dataset=tiny_world.dataset, config_yaml=a.config_yaml, status=Run.Status.FAILED,
                           environment="math_tool", specialization="lora", error_message="OOM")
    c.tags.add(Tag.objects.create(team=tiny_world.team, name="oom"))
    level2 = Dataset.objects.create(team=tiny_world.team, name="math L2 (held out)", kind="generator", environment="math_tool",
                                    env_args={"level": 2}, size=8, eval_size=2, row_count=10, schema=["question", "answer"])
    return {"a": a, "b": b, "c": c, "level2": level2}


def test_it_finds_labels_and_compares_runs(stack: Processes, alice: Member, history: dict[str, Any], browser_page: Any, shots: Path):
    page = browser_page
    a, b = history["a"], history["b"]
    log_in(page, stack, alice)
    try:
        page.goto(stack.url + "/runs/")
        assert page.locator("#runs-table tbody tr").count() == 3
        page.screenshot(path=str(shots / "history-list.png"), full_page=True)
        # Search and filters swap the table in place (htmx) and land in the URL.
        page.fill("input[name=q]", "lr 1e-3")
        page.wait_for_function("() => document.querySelectorAll('#runs-table tbody tr').length === 1")
        assert "q=lr+1e-3" in page.url
        page.fill("input[name=q]", "")
        page.select_option("select[name=tag]", "oom")
        page.wait_for_function("() => document.querySelector('#runs-table tbody').textContent.includes('crashed early')"
                               " && document.querySelectorAll('#runs-table tbody tr').length === 1")
        page.select_option("select[name=tag]", "")
        page.select_option("select[name=sort]", "-metric:reward/total")
        page.wait_for_function("() => document.querySelector('#runs-table tbody tr a').textContent.includes('lr 1e-3')")

        # Compare the two finished runs.
        page.check(f"input[name=ids][value='{a.pk}']")
        page.check(f"input[name=ids][value='{b.pk}']")
        page.click("button.compare-button")
        page.wait_for_url(re.compile(r".*/runs/compare/\?ids=.*"))
        page.wait_for_selector("#compare-chart canvas")
        assert page.evaluate("() => window.troupeCompare.plot().series.length") == 3  # x + one curve per run
        page.select_option("#compare-view", "agents")
        page.wait_for_function("() => window.troupeCompare.plot().series.length === 5")  # 2 runs x 2 agents
        page.select_option("#compare-metric", "loss")
        page.wait_for_function("() => window.troupeCompare.data().metric === 'loss'")
        assert "10% → 45% (+35 pts)" in page.locator("#compare-held-out").inner_text()  # percentages, the change in points
        rows_all = page.locator("#config-diff tbody tr").count()
        page.check("#diff-only")
        page.wait_for_function(f"() => document.querySelectorAll('#config-diff tbody tr').length < {rows_all}")
        assert page.locator("#config-diff tbody tr").count() == 1 and "optim.lr" in page.locator("#config-diff").inner_text()
        page.screenshot(path=str(shots / "history-compare.png"), full_page=True)

        # Tags and notes, edited in place on the run page; the held-out chart per agent.
        page.goto(stack.url + a.get_absolute_url())
        page.click("#run-tags button:has-text('Edit tags')")
        page.fill("#run-tags input[name=tags]", "baseline, paper-fig-2")
        page.click("#run-tags button:has-text('Save')")
        page.wait_for_selector("#run-tags a.tag:has-text('paper-fig-2')")
        page.click("#run-notes button:has-text('Edit notes')")
        page.fill("#run-notes textarea", "Best so far: held-out success 0.1 -> 0.45.")
        page.click("#run-notes button:has-text('Save')")
        page.wait_for_selector("#run-notes .notes-text:has-text('Best so far')")
        page.wait_for_selector("#eval-chart canvas")
        assert page.evaluate("() => window.troupeEvalChart.series.length") == 4  # x, team, tool, reasoner
        page.locator("#held-out").scroll_into_view_if_needed()
        page.screenshot(path=str(shots / "history-run-page.png"), full_page=True)
    except Exception:
        page.screenshot(path=str(shots / "history-failure.png"), full_page=True)
        print(stack.logs())
        raise
    assert sorted(a.tags.values_list("name", flat=True)) == ["baseline", "paper-fig-2"]
    assert Run.objects.get(pk=a.pk).notes.startswith("Best so far")


def test_it_runs_jobs_on_the_worker(stack: Processes, alice: Member, history: dict[str, Any], browser_page: Any, shots: Path):
    page = browser_page
    a = history["a"]
    checkpoint = a.checkpoints.get()
    log_in(page, stack, alice)
    try:
        # Evaluate the step-40 checkpoint on the level-2 dataset: a job the worker picks up.
        page.goto(stack.url + a.get_absolute_url())
        page.select_option("#eval-panel select[name=dataset]", str(history["level2"].pk))
        page.click("#eval-panel button:has-text('Evaluate')")
        page.wait_for_selector("#eval-jobs tr[data-status=succeeded]", timeout=120_000)
        assert "math L2 (held out)" in page.locator("#eval-jobs").inner_text()

        # Export the tool agent merged into its base.
        page.click("#artifacts tr:has(th:text-is('tool')) button:has-text('Export merged model')")
        page.wait_for_selector("#artifacts a:has-text('Download merged model')", timeout=120_000)
        page.locator("#artifacts").scroll_into_view_if_needed()
        page.screenshot(path=str(shots / "history-run-jobs.png"), full_page=True)
        with page.expect_download() as download:
            page.click("#artifacts a:has-text('Download merged model')")
        assert download.value.suggested_filename == f"run-{a.pk}-step-40-tool-merged.zip"

        # The playground: the trained agents and the base models play the same typed task.
        page.click("#run-more summary")  # the secondary actions sit in the head's 'More actions' menu
        page.click("#run-more a:has-text('Try in playground')")
        page.wait_for_selector("#task-fields textarea[name=task_question]")
        page.click("#task-fields button:has-text('example')")
        page.wait_for_function("() => document.querySelector('textarea[name=task_question]').value.startsWith('Compute')")
        page.fill("textarea[name=task_question]", "Compute 12 + 30.")
        page.fill("textarea[name=task_answer]", "42")
        page.fill("input[name=max_new_tokens]", "12")
        page.screenshot(path=str(shots / "history-playground-form.png"), full_page=True)
        page.click("#playground-form button:has-text('Play')")
        page.wait_for_url(re.compile(r".*/playground/\d+/$"))
        page.wait_for_selector("#transcript[data-status=succeeded]", timeout=120_000)
        assert page.locator(".lane").count() == 2 and page.locator(".lane .turn").count() == 4
        assert page.locator(".lane .tool").count() >= 2  # the tool agent's sandbox runs
        page.screenshot(path=str(shots / "history-playground.png"), full_page=True)

        # An API token, shown once, drives the API.
        page.goto(stack.url + "/account/tokens/")
        page.fill("input[name=name]", "notebook")
        page.click("button:has-text('Create token')")
        token = page.locator("#token-text").inner_text().strip()
        page.screenshot(path=str(shots / "history-tokens.png"), full_page=True)
    except Exception:
        page.screenshot(path=str(shots / "history-jobs-failure.png"), full_page=True)
        print(stack.logs())
        raise
    request = urllib.request.Request(stack.url + "/api/v1/runs/?sort=-metric:success", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        runs = json.loads(response.read())
    assert runs["count"] == 3 and runs["results"][0]["id"] in (a.pk, history["b"].pk)
    assert Job.objects.filter(status=Job.Status.SUCCEEDED).count() == 3
    assert checkpoint.jobs.filter(kind=Job.Kind.PLAYGROUND).exists()
