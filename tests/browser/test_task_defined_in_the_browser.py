"""A member brings a task in without touching the server: uploads a dataset, defines a Python
grader and a number grader, tries them on the dataset's first rows, defines a two-role task (an
answerer and a checker) and tries it, makes a topology of it, launches a `lora` run on the tiny
model, and sees each grader's part of the reward charted on the run page."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.browser.conftest import Member
from tests.browser.test_run_live import log_in
from tests.processes import Processes
from webapp.models import ModelSource, Run, Topology

pytestmark = pytest.mark.django_db(transaction=True)

VERDICT = """def grade(completion, row, turns):
    said_ok = "OK" in completion
    answer = turns[-1]["text"] if turns else ""
    right = row["answer"] in answer
    return (1.0 if said_ok == right else 0.0), {"said_ok": float(said_ok)}
"""
ROLES = """- name: answerer
  prompt: "What is {question}? End with: Answer: <number>"
  grader: correct
- name: checker
  prompt: "Is the answer to {question} right? Reply OK or WRONG."
  sees_turns: true
  grader: verdict
"""


def test_a_member_defines_a_task_tries_it_and_trains_a_team_on_it(stack: Processes, alice: Member, browser_page: Any, tmp_path: Path,
                                                                   shots: Path) -> None:
    ModelSource.objects.create(team=alice.team, name="Tiny random Llama", source="tiny-random:llama")
    rows = tmp_path / "sums.jsonl"
    rows.write_text("".join(json.dumps({"question": f"{i} + {i}", "answer": str(2 * i)}) + "\n" for i in range(10)))
    page = browser_page
    log_in(page, stack, alice)

    page.goto(stack.url + "/datasets/upload/")
    page.fill("#id_name", "sums")
    page.select_option("#id_environment", "task")
    page.set_input_files("#id_file", str(rows))
    page.locator("form button.primary").click()
    page.wait_for_url(re.compile(r".*/datasets/\d+/$"))

    page.goto(stack.url + "/graders/new/")
    page.fill("#id_name", "verdict")
    page.select_option("#id_kind", "python")
    page.fill("#id_code", VERDICT)
    page.select_option("#id_try_dataset", label="sums")
    page.fill("#id_try_answer", "OK")
    page.click("button:has-text('Try on sample rows')")
    page.wait_for_selector("#tried table.tried tr.grade-ok")
    assert page.locator("#tried .score").all_inner_texts() == ["0.0"] * 5  # no answer before it: "OK" is wrong
    assert page.locator("#tried code:text-is('said_ok')").count() == 5
    page.locator("#tried").screenshot(path=str(shots / "grader-tried.png"))
    page.click("button.primary:has-text('Save')")
    page.wait_for_url(re.compile(r".*/graders/$"))

    page.goto(stack.url + "/graders/new/")
    page.fill("#id_name", "correct")
    page.select_option("#id_kind", "number")
    page.fill("#id_settings", "column: answer")
    page.click("button.primary:has-text('Save')")
    page.wait_for_url(re.compile(r".*/graders/$"))

    page.goto(stack.url + "/tasks/new/")
    page.fill("#id_name", "sum-check")
    page.select_option("#id_dataset", label="sums")
    page.fill("#id_roles", ROLES)
    page.select_option("#id_team_grader", "correct")
    page.fill("#id_team_role", "answerer")
    page.fill("#id_try_answers", 'answerer: "Answer: 0"\nchecker: OK')
    page.click("button:has-text('Try on sample rows')")
    page.wait_for_selector("#tried table.tried")
    first = page.locator("#tried table.tried tbody tr").first.inner_text()
    assert "What is 0 + 0?" in first and "checker · verdict: 1.0" in first and "team · correct: 1.0" in first, first
    page.locator("#tried").screenshot(path=str(shots / "task-tried.png"))
    page.click("button.primary:has-text('Save')")
    page.wait_for_url(re.compile(r".*/tasks/\d+/$"))

    page.select_option("#id_model_source", label="Tiny random Llama")
    page.select_option("#id_specialization", "lora")
    page.click("button.primary:has-text('Create a topology')")
    page.wait_for_url(re.compile(r".*/topologies/\d+/$"))
    topology = Topology.objects.get(team=alice.team, environment="task")

    page.goto(stack.url + "/runs/new/")
    page.select_option("#id_topology", str(topology.pk))
    page.select_option("#id_dataset", str(topology.team.datasets.get(name="sums").pk))
    page.fill("#id_name", "sum-check on tiny")
    for field, value in (("steps", 2), ("k", 2), ("tasks_per_step", 2), ("max_new_tokens", 8), ("lora_r", 4), ("eval_every", 0)):
        page.fill(f"#id_{field}", str(value))
    page.click("button.primary:has-text('Launch run')")
    page.wait_for_url(re.compile(r".*/runs/\d+/$"))
    run = Run.objects.get(pk=int(page.url.rstrip("/").rsplit("/", 1)[1]))
    assert run.to_config().topology.env_args["definition"]["graders"]["verdict"]["code"] == VERDICT  # the snapshot holds it

    page.wait_for_selector("#run-live[data-status=succeeded]", state="attached", timeout=300_000)
    page.wait_for_function("() => window.runLive.steps('reward/total').length === 2")
    labels = page.locator("#chart-reward-fns .u-legend .u-series .u-label").all_inner_texts()
    assert set(labels) >= {"correct", "verdict", "verdict.said_ok", "team-correct"}, labels
    page.locator("#chart-reward-fns").screenshot(path=str(shots / "task-run-graders.png"))
