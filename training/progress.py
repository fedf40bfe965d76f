"""What a run is doing now, and how long it still needs: the trainer's reports to
`EventSink.status` (see `training.events.PHASES`), each with an ETA from the run's own timings.

The ETA adds up the work left, each part timed on this run: the training steps left at a
median of the latest steps (`RECENT_STEPS`), the evaluations left (every `eval.every` steps and one at the end) at the
last evaluation's duration, and the checkpoints left at the last save's. Before the first step
has finished it is unknown (None): model loading and the step-0 evaluation say nothing about a
step's length.
"""

from __future__ import annotations

import statistics
import time

from training.config import RunConfig
from training.events import EventSink

RECENT_STEPS = 3
"""The step-time estimate is the median of this many latest steps: it follows steps that get faster
as the policy learns to answer shortly within two steps (a plain mean of the last five lagged: an
ETA of 15 min 49 s with 10 min 30 s left), and one slow step (a long generation, a pause) does not
move it, where an exponential moving average jumped (1 min 57 s, then 6 min 50 s, between polls)."""


class RunProgress:
    def __init__(self, sink: EventSink, config: RunConfig, *, has_eval: bool):
        self.sink = sink
        self.total = config.optim.steps
        self.eval_every = config.eval.every if has_eval else 0
        self.checkpoint_every = config.checkpoint.every
        self.step_estimate: float | None = None
        """Seconds the next step should take (None before one has been timed)."""
        self._recent: list[float] = []
        """The latest steps' durations, at most RECENT_STEPS."""
        self.eval_seconds: float | None = None
        self.checkpoint_seconds = 0.0
        self._at = (0, TRAIN)
        """Where the run is: (step, stage); after step s come its evaluation, then its checkpoint."""
        self._started = time.monotonic()
        self._phase_left = 0.0
        """Seconds the current phase should still take."""

    # -- what the trainer calls ------------------------------------------------------------------

    def converting(self, source: str) -> None:
        self._report("converting", f"Converting {source} to a Hugging Face folder (first use only; cached in the data dir)")

    def loading(self, what: str) -> None:
        self._report("loading", f"Loading {what}")

    def evaluating(self, step: int, done: int, n: int, share: float | None = None) -> None:
        """`done` of the `n` held-out episodes at `step` are finished, `share` of the work (by
        default done/n): 0 at the start, 1 at the end."""
        share = (done / n if n else 1.0) if share is None else share
        if share == 0:
            self._started = time.monotonic()
        elapsed = time.monotonic() - self._started
        if share >= 1:
            self.eval_seconds = elapsed
        expected = elapsed / share if share else self.eval_seconds
        self._at, self._phase_left = (step, EVAL), max(0.0, (expected or 0.0) - elapsed)
        # the share counts turns played, `done` whole episodes (each counted after the turn it ended
        # at): episodes that all take every turn end together, so the sentence gives both
        self._report("evaluating", f"Evaluating at step {step} on {n} held-out tasks: {done} of {n} finished "
                                   f"({100 * share:.0f}% of the work)", progress=share)

    def training(self, step: int) -> None:
        """Step `step` starts."""
        self._started = time.monotonic()
        self._at, self._phase_left = (step, TRAIN), self._mean_step() or 0.0
        self._report("training", f"Training step {step} of {self.total}")

    def trained(self) -> None:
        """The step that started last has finished."""
        self._recent = [*self._recent, time.monotonic() - self._started][-RECENT_STEPS:]
        self.step_estimate = statistics.median(self._recent)
        self._phase_left = 0.0

    def checkpointing(self, step: int) -> None:
        self._started = time.monotonic()
        self._at, self._phase_left = (step, CHECKPOINT), self.checkpoint_seconds
        self._report("checkpointing", f"Saving the checkpoint at step {step}")

    def checkpointed(self) -> None:
        self.checkpoint_seconds = time.monotonic() - self._started
        self._phase_left = 0.0

    def stopping(self, step: int) -> None:
        self._report("stopping", f"Stopping as asked: saving a checkpoint at step {step}")

    # -- the estimate ------------------------------------------------------------------------------

    def eta(self) -> float | None:
        """Seconds the run still needs: what is left of the current phase, then every step,
        evaluation and checkpoint after it. None before the first step has been timed."""
        per_step = self._mean_step()
        if per_step is None:
            return None
        step, stage = self._at
        total = self.total
        steps = total - step
        evals = self._left(self.eval_every, step, stage, EVAL) if self.eval_every else 0
        checkpoints = self._left(self.checkpoint_every, step, stage, CHECKPOINT)
        return self._phase_left + steps * per_step + evals * (self.eval_seconds or 0.0) + checkpoints * self.checkpoint_seconds

    def _left(self, every: int, step: int, stage: int, kind: int) -> int:
        """How many evaluations (or checkpoints) come after (`step`, `stage`): one each `every`
        steps before the last (0: none), and one at the last step."""
        total = self.total
        count = 1 if step < total or stage < kind else 0  # the one at the end
        if every:
            count += _multiples(every, step + 1, total - 1)  # the regular ones after this step
            if 0 < step < total and step % every == 0 and stage < kind:  # this step's, still to come
                count += 1
        return count

    def _mean_step(self) -> float | None:
        return self.step_estimate

    def _report(self, phase: str, detail: str, *, progress: float | None = None) -> None:
        self.sink.status(phase, detail, progress=progress, eta=self.eta())


TRAIN, EVAL, CHECKPOINT = 0, 1, 2
"""The stages of a step, in the order the trainer runs them."""


def _multiples(every: int, lo: int, hi: int) -> int:
    """How many multiples of `every` lie in [lo, hi] (lo >= 1)."""
    return max(0, hi // every - (lo - 1) // every)
