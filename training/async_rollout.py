"""One-step-off-policy rollouts (`generation.async: one_step_off`): generation and training at once.

A synchronous step generates its rollouts, then updates on them; on a CPU host each half leaves
the other core idle. Here a sampler thread works one step ahead:

    main thread     | update 1 (w0 -> w1) | update 2 (w1 -> w2) | update 3 ...
    sampler thread  | rollouts 2 with w0  | rollouts 3 with w1  | rollouts 4 with w2 ...

Step t's rollouts come from the weights of step t-2 (one update old, staleness 1; step 1's are
on-policy). At the start of step t the main thread takes step t's rollouts (waiting if the sampler
is not done), copies the trainer's weights into the sampler's copy (only the trained tensors: the
adapters for `lora`, every weight of a trained model otherwise; frozen tensors are shared, never
copied) and hands the sampler step t+1; then it updates. The sampler keeps the log-prob of each
token it sampled, and the update weighs each token by min(pi_old / pi_sampler, C), the truncated
importance sampling that already corrects vLLM's sampler (`training.grpo.truncated_importance_weights`).
On-policy rollouts (staleness 0) drop those log-probs: their weight is exactly 1.

Why a thread and not a process: torch releases the GIL inside its kernels, and on CPU the matmuls
of decoding and of the backward pass are most of a step's time, so two threads keep two cores
busy; the thread sets its own torch thread budget (OpenMP's is per thread). A process would need
its own copy of the environment, the tools' sandbox, the reward functions and the tokenizers, a
second model load at start, and a pipe for the episodes and shared memory for the weights; the
thread shares them and a weight push is an in-memory copy. The Python between kernels does
contend for the GIL (measured in docs/benchmarks.md, "Speed against TRL").

Everything the run does besides generating stays on the main thread, in a synchronous run's
order: events, evaluation, checkpoints and the stop request. Before an evaluation or a checkpoint
the main thread waits for the batch in flight (`settle`): the run's one random generator is then
idle, and a checkpoint saves the batch (`PENDING_FILE`), so a resumed run takes the same rollouts
as the uninterrupted one. A failure in the sampler thread fails the run at its next `take` with
the sampler's reason.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from training.policies import Policy, PolicySet
from training.rollout import Episode, Sampler

PENDING_FILE = "async_rollouts.pt"
"""In a checkpoint of an async run: the next step's rollouts, generated before it was saved."""

LAGS = {"one_step_off": 1}
"""Steps the sampler works ahead of the update, per `generation.async` mode. A lag of 0 runs the
same machinery with the sampler waiting for each update (the tests compare it with `off`)."""


@dataclass
class StepRollouts:
    """One step's rollouts and what making them cost."""

    step: int
    episodes: list[Episode]
    dynamic: dict[str, float] = field(default_factory=dict)
    """Dynamic sampling's metrics (`training.trainer._dynamic_sampling`)."""
    seconds: float = 0.0
    """Wall time the rollouts took (in the sampler thread, when async)."""
    tokens: int = 0
    gen_seconds: float = 0.0
    """Tokens generated and the time spent in generation (`GenerationStats`)."""
    version: int = 0
    """The trainer step whose weights generated them (0: the initial weights)."""


Collect = Callable[[Sampler, int], StepRollouts]
"""Rolls out one step (`training.trainer.collect_rollouts`)."""


class AsyncRollouts:
    """The sampler thread of one run: `take(step)` returns step `step`'s rollouts and starts the
    next step's; `settle` waits for the batch in flight; `close` ends the thread."""

    def __init__(self, sampler: Sampler, collect: Collect, *, lag: int, total_steps: int) -> None:
        self.trainer = sampler
        self.lag, self.total = lag, total_steps
        policies, self.pairs = shadow_policies(sampler.policies)
        self.closing = threading.Event()
        self.sampler = replace(sampler, policies=policies, served={}, logprobs=True, closing=self.closing)
        self.sampler.stats = type(sampler.stats)()
        self.sampler.pool = ThreadPoolExecutor(max_workers=4)
        self.collect = collect
        threads = max(1, torch.get_num_threads() // 2)
        self.threads = threads
        """Torch threads of each side: the sampler thread and the update split the run's budget."""
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="troupe-sampler", initializer=torch.set_num_threads,
                                          initargs=(threads,))
        self._threads_before = torch.get_num_threads()
        torch.set_num_threads(threads)
        self.pending: tuple[int, Future[StepRollouts]] | None = None
        self.push_seconds = 0.0
        """Time the last weight push took."""

    # -- the main thread's side ------------------------------------------------------------------

    def take(self, step: int) -> StepRollouts:
        """Step `step`'s rollouts, and step `step + 1`'s started (with the current weights) when
        the lag is 1. `version` says which weights made them; the caller reads the staleness."""
        if self.pending is None or self.pending[0] != step:
            self._start(step, version=step - 1)
        assert self.pending is not None
        future = self.pending[1]
        self.pending = None
        try:
            got = future.result()
        except Exception as exc:
            raise RuntimeError(f"the sampler thread failed making the rollouts of step {step}: {type(exc).__name__}: {exc}") from exc
        if self.staleness(got) == 0:  # the trainer's own weights sampled them: weight 1, exactly
            for ep in got.episodes:
                for turn in ep.turns:
                    for c in turn.candidates:
                        c.sampler_logprobs = None
        if self.lag and step < self.total:
            self._start(step + 1, version=step - 1)  # the weights of step - 1: step's update has not run
        return got

    def staleness(self, got: StepRollouts) -> int:
        """Updates between the weights that sampled `got` and the ones it updates (step - 1)."""
        return got.step - 1 - got.version

    def settle(self) -> None:
        """Wait for the batch in flight (before an evaluation or a checkpoint); a failure there
        surfaces at `take`."""
        if self.pending is not None:
            self.pending[1].exception()

    def save(self, folder: Path) -> None:
        """Write the settled batch in flight into a checkpoint folder being written."""
        self.settle()
        if self.pending is not None and self.pending[1].exception() is None:
            torch.save(self.pending[1].result(), folder / PENDING_FILE)

    def load(self, folder: Path, step: int) -> bool:
        """Take the next step's rollouts from a checkpoint (`save`); False when it has none."""
        path = folder / PENDING_FILE
        if not path.is_file():
            return False
        got: StepRollouts = torch.load(path, weights_only=False)
        if got.step != step + 1:
            return False
        done: Future[StepRollouts] = Future()
        done.set_result(got)
        self.pending = (got.step, done)
        return True

    def close(self) -> None:
        """Stop the sampler thread (a rollout in flight ends at its next generation) and give the
        main thread its torch threads back."""
        self.closing.set()
        self._thread.shutdown(wait=True, cancel_futures=True)
        self.sampler.pool.shutdown()
        torch.set_num_threads(self._threads_before)

    def _start(self, step: int, *, version: int) -> None:
        """Push the trainer's weights (those of step `version`) and start step `step`'s rollouts."""
        t0 = time.perf_counter()
        push_weights(self.pairs)
        self.push_seconds = time.perf_counter() - t0
        self.pending = (step, self._thread.submit(self._make, step, version))

    # -- the sampler thread's side ---------------------------------------------------------------

    def _make(self, step: int, version: int) -> StepRollouts:
        got = self.collect(self.sampler, step)
        got.version = version
        return got


def shadow_policies(policies: PolicySet) -> tuple[PolicySet, list[tuple[torch.Tensor, torch.Tensor]]]:
    """The sampler's copy of the policies, and the (trainer tensor, copy) pairs a push copies.

    Each model is deep-copied once (the `lora` policies share one PeftModel, so they share one
    copy) with every tensor no optimizer updates left shared: a LoRA copy adds only the adapters.
    Tokenizers are copied too: a fast tokenizer refuses calls from two threads at once."""
    trained = {id(p) for pol in policies.trainable() for p in pol.params}
    models: dict[int, torch.nn.Module] = {}
    tokenizers: dict[int, object] = {}
    out: dict[str, Policy] = {}
    for name, pol in policies.policies.items():
        if id(pol.model) not in models:
            memo: dict[int, object] = {id(t): t for t in [*pol.model.parameters(), *pol.model.buffers()] if id(t) not in trained}
            models[id(pol.model)] = copy.deepcopy(pol.model, memo)
        if id(pol.tokenizer) not in tokenizers:
            tokenizers[id(pol.tokenizer)] = copy.deepcopy(pol.tokenizer)
        out[name] = Policy(pol.name, models[id(pol.model)], tokenizers[id(pol.tokenizer)], pol.agents, pol.trainable,  # type: ignore[arg-type]
                           adapter=pol.adapter)
    pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
    for pol in policies.trainable():
        names = {id(p): n for n, p in pol.model.named_parameters()}
        theirs = dict(models[id(pol.model)].named_parameters())
        pairs += [(p, theirs[names[id(p)]]) for p in pol.params]
    return PolicySet(out, dict(policies.agent_policy), policies.specialization), pairs


@torch.no_grad()
def push_weights(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Copy the trainer's trained tensors into the sampler's copy, in place."""
    for src, dst in pairs:
        dst.copy_(src)
