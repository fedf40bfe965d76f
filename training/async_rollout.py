"""One-step-off-policy rollouts (`generation.async: one_step_off`): generation and training at once.

A synchronous step generates its rollouts, then updates on them; on a CPU host each half leaves
the other core idle. Here a sampler works one step ahead:

    trainer         | update 1 (w0 -> w1) | update 2 (w1 -> w2) | update 3 ...
    sampler         | rollouts 2 with w0  | rollouts 3 with w1  | rollouts 4 with w2 ...

Step t's rollouts come from the weights of step t-2 (one update old, staleness 1; step 1's are
on-policy). At the start of step t the main thread takes step t's rollouts (waiting if the sampler
is not done), copies the trainer's weights into the sampler's copy (only the trained tensors: the
adapters for `lora`, every weight of a trained model otherwise; frozen tensors are shared, never
copied) and hands the sampler step t+1; then it updates. The sampler keeps the log-prob of each
token it sampled, and the update weighs each token by min(pi_old / pi_sampler, C), the truncated
importance sampling that already corrects vLLM's sampler (`training.grpo.truncated_importance_weights`).
On-policy rollouts (staleness 0) drop those log-probs: their weight is exactly 1 (not vLLM's,
whose kernels differ from the trainer's: its log-probs stay, as in a synchronous vLLM run).

The same sampler at lag 0 serves a synchronous run whose rollouts come from a bfloat16 copy
(`generation.dtype: bfloat16`, `training.collect.start_async_rollouts`): `shadow_policies` casts
the copy, each step's rollouts wait for the push before them, and the copy's log-probs stay at
staleness 0 (its numbers are not the trainer's), so the update corrects them as it does vLLM's.

The sampler runs in a process of its own where it can (`process=True`: a run of one process on
CPU, the trainer's choice in `training.trainer.start_async_rollouts`), else in a thread:

- A process has its own interpreter lock. On CPU the Python between the kernels (decoding's
  per-token loop, the modules' forward calls) is a large share of a step, and two threads contend
  for one lock; two processes do not (measured in docs/benchmarks.md, "Speed against TRL"). The
  sampler's models are the shadow copies below with every tensor in shared memory (the frozen
  ones are the trainer's own, moved there): the process maps them, loads nothing from disk, and
  a push is still an in-memory copy it sees at once. It receives the environment, the reward
  functions and the tasks once, and each step's request with the run's generator state; it sends
  back the rollouts and the generator state after them, so the one random stream runs exactly as
  in a thread. It is started with `spawn` (no fork of a process with threads and a torch pool).
  A llama.cpp run's process makes its own engine (`training.llamacpp_backend`) over the shared
  copies and has it push them into its GGUF files at each request, after the run's push; the
  run's own engine serves the held-out evaluation on the trainer's policies.
- A thread shares everything with the update: torch releases the interpreter lock inside its
  kernels, so the matmuls of both sides run at once. It serves the runs a process cannot: several
  processes of a launch, a placement, sharded models, GPUs (whose memory a thread shares) and a
  vLLM engine (`training.vllm_backend`), which the thread drives from the copies: the engine
  notes which copy of a policy it serves, so the push above reaches it as a reload on its next
  generation, and an evaluation on the trainer's own policies reloads those.

Everything the run does besides generating stays on the main thread, in a synchronous run's
order: events, evaluation, checkpoints and the stop request. Before an evaluation or a checkpoint
the main thread waits for the batch in flight (`settle`): the run's one random generator is then
idle, and a checkpoint saves the batch (`PENDING_FILE`), so a resumed run takes the same rollouts
as the uninterrupted one. A failure in the sampler fails the run at its next `take` with
the sampler's reason; a sampler process that dies fails it with its exit code.

The main thread never waits on the sampler unwatched (issue 45, class 5). While it waits for a
batch (`take`, `settle`) it wakes every `POLL_S` to check:

- the run's stop request (`AsyncRollouts.should_stop`, the run's sink): a stop lands even while the
  sampler is stuck; the sampler is abandoned (a process killed) and `take` raises `SamplerStopped`,
  which the loop ends as a stopped run;
- a sampler process's heartbeat (`training.watchdog`): a thread in the process writes the time
  into shared memory every `BEAT_S`; a process that sends none for `silent_s` (`TROUPE_CHILD_SILENT_SECONDS`, 120 by
  default: SIGSTOPped, swapped to a halt, wedged in C holding the interpreter lock) is killed and the
  run fails naming it ("the sampler process (pid N) sent no heartbeat for 120 s ...");
- a process that died: the run fails with its exit code.

`close` waits for a batch in flight at most `CLOSE_S`, then kills the process (a thread, which
cannot be killed, is left to end at its next generation; the run does not wait for it).
"""

from __future__ import annotations

import copy
import os
import resource
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FuturesTimeout
from dataclasses import dataclass, field, replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

from training.policies import Policy, PolicySet
from training.rollout import Episode, Sampler, SamplerClosed
from training.watchdog import BEAT_S, SILENT_ENV, STARTUP_S, silent_limit

PENDING_FILE = "async_rollouts.pt"
"""In a checkpoint of an async run: the next step's rollouts, generated before it was saved."""

POLL_S = 0.5
"""How often a wait on the sampler checks the stop request and the process's heartbeat."""
CLOSE_S = 30.0
"""The longest `close` waits for a batch in flight before killing the sampler process."""


class SamplerStopped(Exception):
    """The run's stop request came while the main thread waited for the sampler's batch."""


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
    """Wall time the rollouts took (in the sampler, when async)."""
    tokens: int = 0
    gen_seconds: float = 0.0
    """Tokens generated and the time spent in generation (`GenerationStats`)."""
    version: int = 0
    """The trainer step whose weights generated them (0: the initial weights)."""


Collect = Callable[[Sampler, list[Any], int], StepRollouts]
"""Rolls out one step on the run's training tasks (`training.trainer.collect_rollouts`); a
module-level function, which a sampler process imports by name."""


class AsyncRollouts:
    """The sampler of one run, a thread or a process: `take(step)` returns step `step`'s rollouts
    and starts the next step's; `settle` waits for the batch in flight; `close` ends the sampler."""

    def __init__(self, sampler: Sampler, tasks: list[Any], collect: Collect, *, lag: int, total_steps: int,
                 process: bool = False, dtype: torch.dtype | None = None) -> None:
        self.trainer = sampler
        self.lag, self.total = lag, total_steps
        self.dtype = dtype
        """The copy's dtype when it differs from the trainer's (`generation.dtype`): its
        log-probs are kept even for on-policy rollouts, whose weights are the trainer's but not
        its numbers."""
        policies, self.pairs = shadow_policies(sampler.policies, dtype)
        self.tasks, self.collect = tasks, collect
        threads = max(1, torch.get_num_threads() // 2) if lag else torch.get_num_threads()
        self.threads = threads
        """Torch threads of each side: the sampler and the update split the run's budget when they
        run at once (lag 1); at lag 0 they take turns, each with all of it."""
        self._threads_before = torch.get_num_threads()
        self.worker: SamplerProcess | None = None
        self.note = ""
        """Why a process was asked for and a thread serves, for the run's log."""
        if process and (why := _no_room_for_a_process(policies)):
            process, self.note = False, why
        if process:
            self.worker = SamplerProcess(sampler, policies, tasks, collect, threads=threads)
            self.closing: Any = self.worker.closing
            self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="troupe-sampler")  # waits on the process
        else:
            self.closing = threading.Event()
            self.sampler = replace(sampler, policies=policies, served={}, logprobs=True, closing=self.closing)
            self.sampler.stats = type(sampler.stats)()
            self.sampler.pool = ThreadPoolExecutor(max_workers=4)
            self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="troupe-sampler", initializer=torch.set_num_threads,
                                              initargs=(threads,))
        torch.set_num_threads(threads)
        self.pending: tuple[int, Future[StepRollouts]] | None = None
        self.push_seconds = 0.0
        """Time the last weight push took."""
        self.should_stop: Callable[[], bool] | None = None
        """The run's stop request, checked while the main thread waits for a batch (the loop sets it
        to its sink's; a run of several processes leaves it None: they stop together, at a step's end)."""
        self.abandoned = False

    @property
    def kind(self) -> str:
        """"process" or "thread": where the sampler runs."""
        return "thread" if self.worker is None else "process"

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
            got = self._wait(future, step)
        except SamplerStopped:
            raise
        except Exception as exc:
            reason = str(exc) if isinstance(exc, SamplerFailed) else f"{type(exc).__name__}: {exc}"
            raise RuntimeError(f"the sampler {self.kind} failed making the rollouts of step {step}: {reason}") from exc
        if self.staleness(got) == 0 and self.trainer.engine is None and self.dtype is None:  # the trainer's own weights and kernels: weight 1, exactly
            for ep in got.episodes:
                for turn in ep.turns:
                    for c in turn.candidates:
                        c.generation = replace(c.generation, logprobs=None)
        if self.lag and step < self.total:
            self._start(step + 1, version=step - 1)  # the weights of step - 1: step's update has not run
        return got

    def staleness(self, got: StepRollouts) -> int:
        """Updates between the weights that sampled `got` and the ones it updates (step - 1)."""
        return got.step - 1 - got.version

    def settle(self) -> None:
        """Wait for the batch in flight (before an evaluation or a checkpoint); a failure there
        surfaces at `take`, a stop request raises `SamplerStopped`."""
        if self.pending is not None:
            step, future = self.pending
            try:
                self._wait(future, step)
            except SamplerStopped:
                self.pending = None
                raise
            except Exception:  # noqa: BLE001 - `take` raises it with the step's context
                pass

    def _wait(self, future: Future[StepRollouts], step: int) -> StepRollouts:
        """`future.result()`, waking every `POLL_S` to check the stop request and the process."""
        while True:
            try:
                return future.result(timeout=POLL_S)
            except FuturesTimeout:
                pass
            if self.worker is not None:
                self.worker.check()  # a silent process is killed here; its waiting thread then raises why
            if self.should_stop is not None and self.should_stop():
                self._abandon()
                raise SamplerStopped(f"stop requested while the sampler {self.kind} made the rollouts of step {step}")

    def _abandon(self) -> None:
        """Give up on the batch in flight: a process is killed, a thread is told to stop (`closing`)
        and left to end on its own."""
        self.abandoned = True
        self.closing.set()
        self.pending = None
        if self.worker is not None:
            self.worker.kill("the run was stopped")

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
        """Stop the sampler (a rollout in flight ends at its next generation) and give the main
        thread its torch threads back. Bounded: a batch in flight is waited for at most `CLOSE_S`
        (less when the process goes silent), then the process is killed; a stuck thread is left."""
        self.closing.set()
        if self.pending is not None:
            deadline = time.monotonic() + CLOSE_S
            future = self.pending[1]
            while not future.done() and time.monotonic() < deadline:
                try:
                    future.exception(timeout=POLL_S)
                except FuturesTimeout:
                    pass
                if self.worker is not None:
                    self.worker.check()
            if not future.done():
                self._abandon()
        stuck = self.abandoned and self.worker is None  # a dead process's pipe wakes its waiting thread; a thread cannot be woken
        self._thread.shutdown(wait=not stuck, cancel_futures=True)
        if self.worker is not None:
            self.worker.close()
        else:
            self.sampler.pool.shutdown(wait=not stuck)
        torch.set_num_threads(self._threads_before)

    def _start(self, step: int, *, version: int) -> None:
        """Push the trainer's weights (those of step `version`) and start step `step`'s rollouts."""
        t0 = time.perf_counter()
        push_weights(self.pairs)
        if self.trainer.engine is not None and self.worker is None:  # the engine reloads the pushed copies on its next generation
            for policy in self.sampler.policies.trainable():  # (a process's own engine does so at each request)
                self.trainer.engine.weights_changed(policy)
        self.push_seconds = time.perf_counter() - t0
        if self.worker is not None:  # the generator's state now: the run's one stream goes on in the process
            state = self.trainer.generator.get_state()
            self.pending = (step, self._thread.submit(self.worker.make, step, version, state, self.trainer.generator))
        else:
            self.pending = (step, self._thread.submit(self._make, step, version))

    # -- the sampler thread's side ---------------------------------------------------------------

    def _make(self, step: int, version: int) -> StepRollouts:
        got = self.collect(self.sampler, self.tasks, step)
        got.version = version
        return got


def _tensors(policies: PolicySet) -> list[torch.Tensor]:
    """Every parameter and buffer of the policies' models (a shared model once): what a sampler
    process maps."""
    models = {id(p.model): p.model for p in policies.policies.values() if p.model is not None}
    return [t for m in models.values() for t in [*m.parameters(), *m.buffers()]]


def _no_room_for_a_process(policies: PolicySet) -> str:
    """Why this host cannot hold the sampler process's shared weights, or "" when it can. Each
    tensor in shared memory takes room in /dev/shm (a container's is 64 MB unless its `shm_size`
    says more) and keeps a file open in this process (torch's `file_descriptor` sharing): the soft
    limit of open files is raised toward the hard one where that makes the room."""
    tensors = _tensors(policies)
    need = sum(t.untyped_storage().nbytes() for t in tensors if not t.is_shared())
    try:
        shm = os.statvfs("/dev/shm")
        free = shm.f_bavail * shm.f_frsize
    except OSError:
        return "this host has no /dev/shm"
    if free < need * 1.1:
        return f"/dev/shm has {free / 2**20:.0f} MiB free for {need / 2**20:.0f} MiB of weights (raise the container's shm_size)"
    files = len(tensors) + len(os.listdir("/proc/self/fd")) + 512
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < files:
        if hard != resource.RLIM_INFINITY and hard < files:
            return f"the open-files limit (RLIMIT_NOFILE) is {hard}, and its weights need about {files}"
        resource.setrlimit(resource.RLIMIT_NOFILE, (files, hard))
    return ""


class SamplerFailed(Exception):
    """What went wrong in a sampler process, as "ExceptionType: message" (or how it died)."""


class SamplerProcess:
    """The sampler's own process (`AsyncRollouts(process=True)`) and the pipe to it."""

    def __init__(self, sampler: Sampler, policies: PolicySet, tasks: list[Any], collect: Collect, *, threads: int) -> None:
        for t in _tensors(policies):
            t.share_memory_()  # the frozen ones are the trainer's tensors: moved, not copied
        ctx = mp.get_context("spawn")
        self.closing = ctx.Event()
        self.conn, theirs = ctx.Pipe()
        self.silent_s = silent_limit()
        self.beat = ctx.Value("d", 0.0, lock=False)
        """The time (monotonic: one clock for every process) of the process's last heartbeat; 0.0
        until its first, which comes once it has imported torch (allowed `STARTUP_S` at least)."""
        self.started = time.monotonic()
        self.killed: str | None = None
        """Why the run killed the process, for the waiting thread's error."""
        self.proc = ctx.Process(target=_serve, args=(theirs, threads, self.closing, self.beat), name="troupe-sampler", daemon=True)
        self.proc.start()
        theirs.close()  # the process's end: closed here, a dead process reads as EOF
        engine = type(sampler.engine) if sampler.engine is not None else None  # the process makes its own (llama.cpp)
        self.setup: tuple[Any, ...] | None = (sampler.config, sampler.env, policies, list(sampler.rewards), list(tasks), collect, engine)
        """Sent with the first request, from the waiting thread (not as the process's arguments:
        the process reports a failure to rebuild them, and the run does not wait for its start)."""

    def make(self, step: int, version: int, state: torch.Tensor, generator: torch.Generator) -> StepRollouts:
        """Step `step`'s rollouts from the process (in `AsyncRollouts`' waiting thread), sampled from
        the generator state `state`; the run's `generator` goes on from the state the process ends with."""
        try:
            try:
                if self.setup is not None:
                    setup, self.setup = self.setup, None
                    self.conn.send(setup)
                self.conn.send((step, state))
            except (BrokenPipeError, ConnectionResetError):  # it ended: it may have said why
                pass
            kind, got, after = self.conn.recv()
        except (EOFError, OSError):
            self.proc.join(timeout=5)
            if self.killed is not None:
                raise SamplerFailed(self.killed) from None
            raise SamplerFailed(f"the process died (exit code {self.proc.exitcode})") from None
        if kind == "closed":
            raise SamplerClosed(got)
        if kind == "error":
            raise SamplerFailed(got)
        generator.set_state(after)
        got.version = version
        return got  # type: ignore[no-any-return]

    def check(self) -> None:
        """Kill the process if its heartbeat is older than `silent_s` (the waiting thread then
        raises why)."""
        if self.killed is not None or not self.proc.is_alive():
            return
        last = self.beat.value
        silent = time.monotonic() - (last or self.started)
        if silent > (self.silent_s if last else max(self.silent_s, STARTUP_S)):
            self.kill(f"the process (pid {self.proc.pid}) sent no heartbeat for {silent:.0f} s (stopped or hung; the limit "
                      f"is {SILENT_ENV}={self.silent_s:g}): killed")

    def kill(self, why: str) -> None:
        """SIGKILL the process (it may be stopped: nothing else reaches it) and note why."""
        if self.killed is None:
            self.killed = why
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(timeout=30)

    def close(self) -> None:
        if self.proc.is_alive() and self.killed is None:
            try:
                self.conn.send(None)
            except OSError:
                pass
            deadline = time.monotonic() + CLOSE_S
            while self.proc.is_alive() and time.monotonic() < deadline and self.killed is None:
                self.proc.join(timeout=POLL_S)
                self.check()
        if self.proc.is_alive():
            self.kill("the run ended and the process did not")
        self.proc.join()
        self.conn.close()


def _serve(conn: Connection, threads: int, closing: Any, beat: Any) -> None:
    """The sampler process: rebuild the sampler from what the run sends, then answer each
    (step, generator state) with that step's rollouts and the generator state after them. A
    thread writes the heartbeat (`beat`) every `BEAT_S` while the process runs."""

    def heartbeat() -> None:
        while True:
            beat.value = time.monotonic()
            time.sleep(BEAT_S)

    threading.Thread(target=heartbeat, name="troupe-sampler-heartbeat", daemon=True).start()
    torch.set_num_threads(threads)
    sampler: Sampler | None = None
    try:
        config, env, policies, rewards, tasks, collect, engine = conn.recv()
        sampler = Sampler(env, policies, config, torch.Generator(), rewards, logprobs=True, closing=closing)
        if engine is not None:
            sampler.engine = engine(config, policies, threads=threads)
    except EOFError:
        return
    except Exception as exc:
        conn.send(("error", f"setting the sampler up: {type(exc).__name__}: {exc}", None))
        if sampler is not None:
            sampler.pool.shutdown(wait=False)
        return
    assert sampler is not None
    try:
        while (request := conn.recv()) is not None:
            step, state = request
            sampler.generator.set_state(state)
            if sampler.engine is not None:  # the run pushed its trained weights into the shared copies before asking
                for policy in sampler.policies.trainable():
                    sampler.engine.weights_changed(policy)
            try:
                conn.send(("ok", collect(sampler, tasks, step), sampler.generator.get_state()))
            except SamplerClosed as exc:
                conn.send(("closed", str(exc), None))
            except Exception as exc:  # the run fails with it, at its next `take`
                conn.send(("error", f"{type(exc).__name__}: {exc}", None))
    except (EOFError, KeyboardInterrupt):  # the run is gone
        pass
    finally:
        sampler.pool.shutdown(wait=False, cancel_futures=True)
        if sampler.engine is not None:
            sampler.engine.close()
        close_env = getattr(env, "close", None)  # this process's copy's own processes (agents.envs.task: its Python graders)
        if callable(close_env):
            close_env()


def shadow_policies(policies: PolicySet, dtype: torch.dtype | None = None) -> tuple[PolicySet, list[tuple[torch.Tensor, torch.Tensor]]]:
    """The sampler's copy of the policies, and the (trainer tensor, copy) pairs a push copies.

    Each model is deep-copied once (the `lora` policies share one PeftModel, so they share one
    copy) with every tensor no optimizer updates left shared: a LoRA copy adds only the adapters.
    Tokenizers are copied too: a fast tokenizer refuses calls from two threads at once.

    `dtype` (`generation.dtype: bfloat16`): every floating-point parameter of the copy is in
    `dtype`, the frozen ones too (cast once here, no longer shared); buffers stay as they are (the
    rotary frequencies keep their precision). A push then casts as it copies."""
    trained = {id(p) for pol in policies.trainable() for p in pol.params}
    models: dict[int, torch.nn.Module] = {}
    tokenizers: dict[int, object] = {}
    out: dict[str, Policy] = {}
    for name, pol in policies.policies.items():
        if id(pol.model) not in models:
            memo: dict[int, object] = {id(t): t for t in pol.model.buffers()}
            for t in pol.model.parameters():
                if id(t) not in trained and id(t) not in memo:
                    memo[id(t)] = t if dtype is None else _cast(t, dtype)
            models[id(pol.model)] = copy.deepcopy(pol.model, memo)
            if dtype is not None:
                _cast_parameters(models[id(pol.model)], dtype)
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


def _cast(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A parameter's copy in `dtype` (integer and already-`dtype` tensors as they are)."""
    if not t.is_floating_point() or t.dtype == dtype:
        return t
    return torch.nn.Parameter(t.detach().to(dtype), requires_grad=t.requires_grad)


def _cast_parameters(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """Every floating-point parameter of `model` in `dtype`, in place; a parameter two modules
    share (tied embeddings) stays one parameter."""
    done: dict[int, torch.Tensor] = {}
    for module in model.modules():
        for key, param in list(module._parameters.items()):
            if param is not None:
                module._parameters[key] = done.setdefault(id(param), _cast(param, dtype))  # type: ignore[assignment]


@torch.no_grad()
def push_weights(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Copy the trainer's trained tensors into the sampler's copy, in place."""
    for src, dst in pairs:
        dst.copy_(src)
