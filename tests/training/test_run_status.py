"""The trainer says what it is doing now through `EventSink.status`: loading, evaluating with
progress, training step N, saving a checkpoint; with an ETA timed on the run itself."""

from __future__ import annotations

import io

import pytest

from tests.training.conftest import toy_config
from training import progress as progress_module
from training.events import PHASES, JsonlSink, NullSink, ProgressSink
from training.models import needs_conversion
from training.progress import RunProgress
from training.trainer import train


class Phases(NullSink):
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, float | None, float | None]] = []
        self.order: list[str] = []

    def status(self, phase, detail, *, progress=None, eta=None):
        self.calls.append((phase, detail, progress, eta))
        self.order.append(f"status:{phase}")

    def metrics(self, m):
        self.order.append(f"metrics:{m.step}")

    def evaluation(self, result):
        self.order.append(f"evaluation:{result['step']}")


def test_it_reports_each_phase_of_a_run_in_order(tmp_path):
    sink = Phases()
    config = toy_config(**{"optim.steps": 3, "eval.every": 2, "eval.size": 4, "checkpoint.every": 2})
    train(config, out_dir=tmp_path, sink=sink)
    assert {phase for phase, *_ in sink.calls} <= set(PHASES)
    phases = [p for p, *_ in sink.calls]
    assert phases[0] == "loading"
    # step 0's evaluation, with its progress from none to all 4 tasks, before the first step
    first_step = sink.order.index("status:training")
    evals0 = [c for c in sink.calls[: phases.index("training")] if c[0] == "evaluating"]
    assert [c[2] for c in evals0] == [0.0, 0.5, 1.0]  # after each of its 2 turns
    # the sentence agrees with the bar: after the first of 2 turns half the work is done, no task finished yet
    assert [c[1] for c in evals0] == [f"Evaluating at step 0 on 4 held-out tasks: {d} of 4 finished ({p} of the work)"
                                      for p, d in (("0%", 0), ("50%", 0), ("100%", 4))]
    assert sink.order.index("evaluation:0") < first_step
    assert [d for p, d, *_ in sink.calls if p == "training"] == [f"Training step {s} of 3" for s in (1, 2, 3)]
    assert [d for p, d, *_ in sink.calls if p == "checkpointing"] == ["Saving the checkpoint at step 2", "Saving the checkpoint at step 3"]
    assert [d for p, d, *_ in sink.calls if p == "evaluating" and "4 of 4 finished" in d] == [
        f"Evaluating at step {s} on 4 held-out tasks: 4 of 4 finished (100% of the work)" for s in (0, 2, 3)]
    # no ETA until a step has been timed; then one with each report, shrinking to (about) nothing
    etas = [eta for *_, eta in sink.calls]
    untimed = phases.index("training") + 1
    assert etas[:untimed] == [None] * untimed
    assert all(e is not None and e >= 0 for e in etas[untimed:])


def test_a_stop_request_says_it_is_stopping(tmp_path):
    class StopAfterOne(Phases):
        def should_stop(self):
            return "metrics:1" in self.order

    sink = StopAfterOne()
    result = train(toy_config(**{"optim.steps": 5}), out_dir=tmp_path, sink=sink)
    assert result.status == "cancelled"
    assert ("stopping", "Stopping as asked: saving a checkpoint at step 1") in [(p, d) for p, d, *_ in sink.calls]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_eta_counts_the_steps_evaluations_and_checkpoints_left(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(progress_module.time, "monotonic", clock)
    sink = Phases()
    config = toy_config(**{"optim.steps": 10, "eval.every": 5, "checkpoint.every": 0})
    p = RunProgress(sink, config, has_eval=True)
    p.evaluating(0, 0, 100)
    clock.now += 30  # step 0's evaluation: 30 s
    p.evaluating(0, 100, 100)
    assert sink.calls[-1][3] is None  # no step timed yet
    p.training(1)
    clock.now += 4  # a step: 4 s
    p.trained()
    p.checkpointing(1)  # (checkpoint.every 0: only for the arithmetic; saving takes no time here)
    p.checkpointed()
    p.training(2)
    # after step 1: step 2's 4 s, 8 more steps, the evaluations at step 5 and at the end, the final checkpoint
    assert sink.calls[-1][3] == pytest.approx(4 + 8 * 4 + 2 * 30)
    clock.now += 4
    p.trained()
    for step in (3, 4, 5):
        p.training(step)
        clock.now += 4
        p.trained()
    p.evaluating(5, 0, 100)
    clock.now += 15
    p.evaluating(5, 50, 100)  # half-way: 15 s left of it, then 5 steps and the final evaluation
    assert sink.calls[-1][2] == 0.5
    assert sink.calls[-1][3] == pytest.approx(15 + 5 * 4 + 30)


def test_it_knows_when_a_bundled_model_must_be_converted_first(monkeypatch, tmp_path):
    monkeypatch.setenv("TROUPE_DATA_DIR", str(tmp_path))
    assert needs_conversion("bundled:smollm2-135m-instruct")
    assert not needs_conversion("tiny-random:llama") and not needs_conversion("local:/models/x")
    folder = tmp_path / "models" / "smollm2-135m-instruct"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"")
    assert not needs_conversion("bundled:smollm2-135m-instruct")


def test_the_cli_sinks_show_and_keep_the_status(tmp_path):
    stream = io.StringIO()
    bar = ProgressSink(stream)
    bar.status("evaluating", "Evaluating at step 0: 25/100 held-out tasks", progress=0.25)
    bar.status("evaluating", "Evaluating at step 0: 50/100 held-out tasks", progress=0.5)
    bar.status("evaluating", "Evaluating at step 0 on 8 held-out tasks: 75% done (0 finished)", progress=0.75)
    bar.log("done")
    assert stream.getvalue().split("\r")[1:] == [
        "Evaluating at step 0: 25/100 held-out tasks (25%)",
        "Evaluating at step 0: 50/100 held-out tasks (50%)",
        "Evaluating at step 0 on 8 held-out tasks: 75% done (0 finished)",  # a sentence with its share: not twice
        "[info] done".ljust(len("Evaluating at step 0 on 8 held-out tasks: 75% done (0 finished)")) + "\n",
    ]
    JsonlSink(tmp_path).status("training", "Training step 1 of 2", eta=12.5)
    line = (tmp_path / "events.jsonl").read_text()
    assert '"type": "status"' in line and '"phase": "training"' in line and '"eta": 12.5' in line


def test_the_eta_follows_steps_that_get_faster(monkeypatch):
    """Untrained policies write long answers: the first steps are slow, later ones fast. Two fast
    steps in, the ETA is near the truth (a mean of the last five steps said more than twice it)."""
    clock = Clock()
    monkeypatch.setattr(progress_module.time, "monotonic", clock)
    sink = Phases()
    p = RunProgress(sink, toy_config(**{"optim.steps": 10, "checkpoint.every": 0}), has_eval=False)
    for step, seconds in zip(range(1, 6), (90, 90, 90, 30, 30)):
        p.training(step)
        clock.now += seconds
        p.trained()
    p.training(6)
    left = 5 * 30  # steps 6..10 at 30 s
    assert sink.calls[-1][3] == pytest.approx(left, rel=0.35)
    for step in range(6, 9):
        clock.now += 30
        p.trained()
        p.training(step + 1)
    assert sink.calls[-1][3] == pytest.approx(2 * 30, rel=0.05)  # settled on the new pace
    clock.now += 200  # one slow step (a long generation): the ETA does not jump
    p.trained()
    p.training(10)
    assert sink.calls[-1][3] == pytest.approx(30, rel=0.05)


def test_an_evaluation_counts_each_task_as_it_ends(monkeypatch):
    """Issue 46, class 3: episodes that end early are counted finished at the turn they end, not
    only when their whole batch ends."""
    from training.evaluation import _turn_done

    reported = []
    _turn_done(lambda done, share: reported.append((done, share)), 0, 10, 4, 2, 3)  # turn 2 of 4: 3 of 10 ended
    assert reported == [(3, 3 + 7 * 2 / 4)]


def test_an_evaluation_line_names_its_decoding_not_a_bare_T():
    result = {"step": 4, "temperature": 0.0, "n": 8, "team": {"success": 0.5}, "agents": {"tool": {"success": 0.25}}}
    stream = io.StringIO()
    ProgressSink(stream).evaluation(result)
    ProgressSink(stream).evaluation({**result, "temperature": 0.7})
    assert "[eval] step 4 greedy, 8 tasks: team success 0.500" in stream.getvalue()
    assert "[eval] step 4 temperature 0.7, 8 tasks:" in stream.getvalue() and "T=" not in stream.getvalue()
