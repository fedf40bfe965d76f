"""A person warm-starts from a finished run's best episodes: on the run page, "Warm start from this
run" opens the preview (how many examples each agent gets, and a few of them), a threshold changes it
live, and the launch queues an SFT run that the worker trains on the tiny model to the end, its loss
charted per step."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.browser.conftest import Member, TinyWorld
from tests.browser.test_run_live import log_in, wait_for_socket, wait_for_status
from tests.processes import Processes
from webapp.models import Dataset, Rollout, Run
from webapp.runs import services as run_services

pytestmark = pytest.mark.django_db(transaction=True)

STEPS = 2


def _prompt(text: str) -> str:
    return f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"


def finished_run(alice: Member, world: TinyWorld) -> Run:
    """A finished GRPO run on the tiny model with three stored episodes, two of which succeeded (rows
    shaped as the run's sink stores them; the episodes need no training to exist)."""
    config = run_services.run_config_build(topology=world.topology, dataset=world.dataset, name="tiny source",
                                           overrides={"optim.steps": 2, "lora.r": 4, "generation.max_new_tokens": 8, "eval.every": 0})
    run = Run.objects.create(team=alice.team, owner=alice.user, name="tiny source", topology=world.topology, dataset=world.dataset,
                             config_yaml=config.to_yaml(), status=Run.Status.SUCCEEDED, step=2, total_steps=2,
                             environment="math_tool", specialization="lora")
    for i, (a, b, ok) in enumerate([(2, 3, True), (4, 3, True), (6, 6, False)]):
        answer = a + b if ok else 0
        turns = [
            {"index": 0, "agent": "tool", "role": "tool", "prompt": _prompt(f"What is {a}+{b}?"), "chosen": 0, "candidates": [
                {"text": f"```python\nprint({a}+{b})\n```", "reward": 1.0, "team": 1.0, "local": 0.0, "advantage": 0.0,
                 "tool_output": str(a + b), "tokens": 8, "truncated": False}]},
            {"index": 1, "agent": "reasoner", "role": "reasoner", "prompt": _prompt(f"The tool printed {a + b}."), "chosen": 0,
             "candidates": [{"text": str(answer), "reward": float(ok), "team": float(ok), "local": 0.0, "advantage": 0.0,
                             "tool_output": None, "tokens": 1, "truncated": False}]},
        ]
        Rollout.objects.create(run=run, step=2, episode=i, agent_names=["tool", "reasoner"], success=ok, team_reward=float(ok),
                               data={"task_id": f"t{i}", "step": 2, "success": ok, "team_reward": float(ok), "turns": turns})
    return run


def test_it_warm_starts_an_sft_run_from_a_run_s_best_episodes(stack: Processes, alice: Member, tiny_world: TinyWorld,
                                                                browser_page: Any, shots: Path):
    source = finished_run(alice, tiny_world)
    page = browser_page
    log_in(page, stack, alice)
    page.goto(stack.url + source.get_absolute_url())
    page.click("#run-more summary")  # the secondary actions sit in the head's menu
    page.click("#warm-start")
    page.wait_for_url(re.compile(rf".*/runs/{source.pk}/warm-start/$"))
    preview = page.locator("#warm-preview")
    assert "2 of 3 stored episodes succeeded" in preview.inner_text()
    assert preview.locator("table.warm-counts tbody tr").all_inner_texts() == ["tool\t2", "reasoner\t2"]
    assert "print(2+3)" in preview.inner_text()
    page.screenshot(path=str(shots / "warm-start-preview.png"), full_page=True)

    page.fill("#id_threshold", "0")  # every episode: the preview follows the form over htmx
    page.locator("#id_threshold").dispatch_event("change")
    page.wait_for_function("() => document.querySelector('#warm-preview').textContent.includes('3 of 3 stored episodes')")
    page.fill("#id_threshold", "")
    page.locator("#id_threshold").dispatch_event("change")
    page.wait_for_function("() => document.querySelector('#warm-preview').textContent.includes('2 of 3 stored episodes succeeded')")
    page.fill("#id_steps", str(STEPS))
    page.fill("#id_batch_size", "2")
    page.click("#warm-start-launch")
    page.wait_for_url(re.compile(r".*/runs/\d+/$"))
    run_id = int(page.url.rstrip("/").rsplit("/", 1)[1])
    assert run_id != source.pk
    wait_for_socket(page)
    try:
        wait_for_status(page, "succeeded", 300)
        page.wait_for_function(f"() => window.runLive.steps('loss').length === {STEPS}", timeout=120_000)
    except Exception:
        page.screenshot(path=str(shots / "warm-start-failure.png"), full_page=True)
        print(stack.logs())
        raise
    page.wait_for_timeout(1500)  # the charts settle for the screenshot
    page.screenshot(path=str(shots / "warm-start-sft-run.png"), full_page=True)

    run = Run.objects.get(pk=run_id)
    dataset = Dataset.objects.get(team=alice.team, kind=Dataset.Kind.CHATS)
    assert run.status == Run.Status.SUCCEEDED and run.algorithm == "sft" and run.to_config().sft.path == str(dataset.path)
    assert dataset.row_count == 4 and set(run.metric_points.last().agents) == {"tool", "reasoner"}
    assert "SFT (supervised fine-tuning)" in page.locator("#run-summary").inner_text()
