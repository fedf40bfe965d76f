"""llama.cpp generation backend for CPU runs (`generation.backend: llamacpp`).

The HF backend spends most of a CPU decode step in Python and in transformers' per-layer work
around the matmuls; llama.cpp runs the whole step in C (bench/generation.py measures both on the
same prompts). This backend keeps everything that decides *what* is generated in Troupe: the
tokens are drawn by `training.generation.decode` (the same sampler, generator, stop tokens, stop
patterns and row bookkeeping as the HF backend) from the logits llama.cpp computes. llama.cpp
only holds the weights and the KV cache, through llama-cpp-python's low-level API:

- One GGUF file per policy (a `lora` agent's adapter merged into its own copy of the base), in
  `generation.dtype`'s type (`gguf_type`): `model` -> the trainer's dtype (F32: its numbers up to
  summation order), `bfloat16` -> BF16 (half the bytes per weight; norms stay F32, as the converter
  writes them).
  llama.cpp's converter (`conversion`, the package `training.export` uses) writes it once,
  with a placeholder vocabulary: llama.cpp never tokenizes here, it is handed token ids.
- Weights reach llama.cpp without a reload: llama.cpp maps the file (`use_mmap`) and reads F32
  and BF16 tensors where they lie in the mapping, so writing the policy's current weights into
  the same file through a shared mapping of our own changes what the next decode reads.
  `weights_changed(policy)` marks the policy stale; its next `generate` pushes every tensor again
  (converted by the converter's own `modify_tensors`, which permutes q/k for llama.cpp's rope).
  The files live in /dev/shm where it has room for them (else in the temporary folder), so the
  writes never go to a disk, and are unlinked as soon as both mappings hold them: a killed run
  leaves no file behind. An async run's sampler process has an engine and files of its own.
- The prompts of one call are prefilled once, each in its own sequence, and copied to the n-1
  sibling sequences (`llama_memory_seq_cp` in a unified KV cache shares the cells); a finished
  row's sequence is removed from the cache, so the rows still running pay for no others.

Its numbers are not the trainer's (other kernels; in BF16 other weights), so every `Generation`
carries the sampled tokens' log-probs and the update corrects the mismatch with truncated
importance sampling, as for vLLM (`mismatch/logp_diff` reports it). One process on the CPU;
the trainer drives it as it drives `training.vllm_backend.VLLMGenerator` (`generate`,
`weights_changed`, `sleep`, `close`).
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from training.config import LLAMACPP_MAX_SEQUENCES, RunConfig
from training.generation import Generation, GenerationStats, decode, stop_token_ids
from training.policies import Policy, PolicySet

DTYPE_GGUF_TYPES = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}
"""The dtype llama.cpp's weights are in -> the GGUF tensor type the policies are written in (not
the export's `training.gguf_conversion.GGUF_TYPES`)."""
MAX_SEQUENCES = LLAMACPP_MAX_SEQUENCES
"""Rows (prompts x n) one decode batch holds; a call with more runs in chunks of prompts (the
config refuses a `grpo.k` above it)."""
BATCH_TOKENS = 512
"""Tokens per `llama_decode` call (a longer prefill is split)."""


def gguf_type(config: RunConfig) -> str:
    """The GGUF type of the run's llama.cpp weights: `generation.dtype`, where `model` is the
    dtype the trainer's weights are in (F32 on the CPU; BF16 or F16 with that `model.dtype`)."""
    return DTYPE_GGUF_TYPES[config.model.trains_in(cuda=False) if config.generation.dtype == "model" else config.generation.dtype]


def _shm_dir(need: int) -> str | None:
    """/dev/shm when it has room for `need` bytes (a container's is 64 MB unless its `shm_size` says
    more), else None: the system's temporary folder (its pages are written back to disk, slower)."""
    try:
        shm = os.statvfs("/dev/shm")
    except OSError:
        return None
    return "/dev/shm" if os.access("/dev/shm", os.W_OK) and shm.f_bavail * shm.f_frsize >= need * 1.1 else None


def hf_weights(policy: Policy) -> Iterator[tuple[str, torch.Tensor]]:
    """The policy's current weights under the Hugging Face names of a plain model, one at a time
    (a push streams them into the file: no second copy of the model at once): a `lora` policy's
    adapter merged into the base (peft's `get_delta_weight`: the scaled B @ A), the other adapters
    left out; a tied output head once, as the embedding."""
    model: Any = policy.model
    tied = getattr(model.config, "tie_word_embeddings", False)
    if policy.adapter is None:
        for name, tensor in model.state_dict().items():
            if not (tied and name == "lm_head.weight"):
                yield name, tensor.detach()
        return
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    merged = {}
    module: Any
    for name, module in base.named_modules():
        if isinstance(module, LoraLayer) and policy.adapter in module.lora_A:
            merged[f"{name}.weight"] = module
    for name, tensor in base.state_dict().items():
        name = name.replace(".base_layer.", ".")
        if ".lora_" in name or (tied and name == "lm_head.weight"):
            continue
        module = merged.get(name)
        if module is None:
            yield name, tensor.detach()
        else:  # every LoRA layer kind has get_delta_weight
            yield name, (module.get_base_layer().weight + module.get_delta_weight(policy.adapter)).detach()


@dataclass
class _Served:
    """One policy's llama.cpp model (its GGUF file mapped) and context, and the views a push writes through."""

    converter: Any
    model: Any
    ctx: Any
    n_ctx: int
    views: dict[str, torch.Tensor]
    mapping: Any
    vocab: int
    stale: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


class LlamaCppGenerator:
    """Generates for the policies of one run with llama.cpp (see the module docstring)."""

    cuda = False
    label = "llama.cpp"
    max_model_len = None
    """No limit of its own: each call's context grows to what it needs (`_room`)."""

    def __init__(self, config: RunConfig, policies: PolicySet, *, threads: int | None = None) -> None:
        import llama_cpp

        self.config, self.policies = config, policies
        self.gguf_type = gguf_type(config)
        self.evaluates = config.generation.dtype == "model"
        """Held-out evaluation generates here only when llama.cpp's weights are in the trainer's
        dtype; BF16 weights over an fp32 trainer leave it to the HF backend on the trainer's own."""
        self.threads = threads or torch.get_num_threads()
        self.L = llama_cpp
        llama_cpp.llama_backend_init()
        llama_cpp.llama_log_set(_quiet, ctypes.c_void_p(0))
        self._served: dict[int, tuple[Policy, _Served]] = {}
        """id(policy) -> (the policy, what serves it): the trainer's policies and an async run's
        copies of them each have their own file."""
        self._lock = threading.Lock()
        self.closed = False

    # -- the trainer's side (as VLLMGenerator) ------------------------------------------------------

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
        generator: torch.Generator | None = None,
        stats: GenerationStats | None = None,
        stop: re.Pattern[str] | None = None,
        stop_check_every: int = 4,
    ) -> list[list[Generation]]:
        """Sample `n` completions for each prompt with `policy`'s current weights, as
        `training.generation.generate` does (its `decode`), from llama.cpp's logits; each
        completion keeps its tokens' log-probs. `generator`, else a generator seeded with `seed`."""
        if not prompts:
            return []
        if generator is None:
            generator = torch.Generator()
            if seed is not None:
                generator.manual_seed(seed)
        served = self._serve(policy)
        stops = stop_token_ids(policy.model, policy.tokenizer)
        out: list[list[Generation]] = []
        with served.lock:
            for chunk in _chunks(prompts, n):
                self._room(chunk, n, max_new_tokens, served)
                decoder = _LlamaDecoder(self.L, served)
                out += decode(decoder, policy.tokenizer, chunk, n=n, max_new_tokens=max_new_tokens, temperature=temperature,
                              top_p=top_p, generator=generator, stats=stats, stop=stop, stop_check_every=stop_check_every,
                              logprobs=True, stops=stops)
        return out

    def weights_changed(self, policy: Policy | None = None) -> None:
        """The policy's weights changed (None: every policy's): its next `generate` pushes them."""
        for pol, served in self._served.values():
            if policy is None or pol is policy:
                served.stale = True

    def sleep(self) -> None:
        """Nothing to give back: llama.cpp runs on the CPU, beside the update."""

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for _, served in self._served.values():
            self.L.llama_free(served.ctx)
            self.L.llama_model_free(served.model)
            served.views.clear()
            served.mapping = None
        self._served.clear()

    # -- serving a policy -------------------------------------------------------------------------

    def _serve(self, policy: Policy) -> _Served:
        if self.closed:
            raise RuntimeError("the llama.cpp backend was closed")
        with self._lock:
            got = self._served.get(id(policy))
            if got is None:
                got = (policy, self._load(policy))
                self._served[id(policy)] = got
        served = got[1]
        if served.stale:
            with served.lock:
                if served.stale:
                    served.stale = False  # before the push: a weights_changed during it makes the next call push again
                    self._push(policy, served)
        return served

    def _load(self, policy: Policy) -> _Served:
        """Write the policy's weights to a GGUF file of their own and load it (mapped)."""
        import gguf
        from safetensors.torch import save_file

        from training.gguf_conversion import gguf_architecture, gguf_convert

        weights = dict(hf_weights(policy))
        vocab = int(policy.model.config.vocab_size)
        if vocab < 256:
            raise ValueError(f"generation.backend llamacpp needs a vocabulary of at least 256 tokens; this model has {vocab}")
        model: Any = policy.model
        plain = model.get_base_model() if policy.adapter is not None else model
        config = plain.config.to_dict()
        config["architectures"] = config.get("architectures") or [type(plain).__name__]  # a model built in code has none
        # The folder goes when the file is mapped (both mappings keep it alive): a run killed later leaves nothing behind.
        size = sum(t.numel() * t.element_size() for t in weights.values())  # the safetensors; the GGUF is no larger
        with tempfile.TemporaryDirectory(prefix="troupe-llamacpp-", dir=_shm_dir(2 * size)) as tmp:
            hf_dir, path = Path(tmp) / "hf", Path(tmp) / "weights.gguf"
            hf_dir.mkdir()
            (hf_dir / "config.json").write_text(json.dumps(config))
            save_file({k: v.contiguous() for k, v in weights.items()}, str(hf_dir / "model.safetensors"))
            converter = gguf_convert(hf_dir, path, gguf_type=self.gguf_type, converter_class=_converter(gguf_architecture(hf_dir)))
            reader = gguf.GGUFReader(str(path), "r+")
            views = {t.name: _view(t) for t in reader.tensors}
            mp = self.L.llama_model_default_params()
            mp.use_mmap = True
            loaded = self.L.llama_model_load_from_file(str(path).encode(), mp)
        if not loaded:
            raise RuntimeError(f"llama.cpp could not load the GGUF written for policy {policy.name}")
        served = _Served(converter, loaded, None, 0, views, reader.data, vocab)
        self._context(served, 4096)
        return served

    def _context(self, served: _Served, n_ctx: int) -> None:
        """(Re)make the policy's context with room for `n_ctx` cells of KV cache."""
        if served.ctx is not None:
            self.L.llama_free(served.ctx)
        cp = self.L.llama_context_default_params()
        cp.n_ctx = n_ctx
        cp.n_batch = cp.n_ubatch = BATCH_TOKENS
        cp.n_seq_max = MAX_SEQUENCES
        cp.n_threads = cp.n_threads_batch = self.threads
        cp.kv_unified = True  # the n candidates share their prompt's cells
        cp.no_perf = True
        served.ctx = self.L.llama_init_from_model(served.model, cp)
        if not served.ctx:
            raise RuntimeError(f"llama.cpp could not make a context of {n_ctx} cells")
        served.n_ctx = n_ctx

    def _room(self, prompts: list[list[int]], n: int, max_new_tokens: int, served: _Served) -> None:
        """A context with KV cells for the call: each prompt once (its candidates share it), and
        each row's completion; grown to the next power of two when short."""
        need = sum(len(p) for p in prompts) + len(prompts) * n * max_new_tokens
        if need > served.n_ctx:
            self._context(served, 1 << (need - 1).bit_length())

    @torch.no_grad()
    def _push(self, policy: Policy, served: _Served) -> None:
        """Write the policy's current weights into its mapped GGUF file, in place."""
        for name, tensor in hf_weights(policy):
            bid = next((int(part) for part in name.split(".") if part.isdecimal()), None)
            for gguf_name, data in served.converter.modify_tensors(tensor, name, bid):
                view = served.views.get(gguf_name)
                if view is not None:
                    view.copy_(data.reshape(-1))


class _LlamaDecoder:
    """A policy's llama.cpp context as `training.generation.decode`'s `Decoder`: row r decodes in
    sequence r of the context's unified KV cache."""

    def __init__(self, L: Any, served: _Served) -> None:
        self.L, self.served = L, served
        self.mem = L.llama_get_memory(served.ctx)
        self.batch = L.llama_batch_init(BATCH_TOKENS, 0, 1)
        self.rows: list[int] = []
        self.pos: list[int] = []

    def __del__(self) -> None:
        self.L.llama_batch_free(self.batch)

    def prefill(self, prompts: list[list[int]], n: int, max_new_tokens: int) -> torch.Tensor:
        self.L.llama_memory_clear(self.mem, True)
        entries = [(tok, j, b * n, j == len(p) - 1) for b, p in enumerate(prompts) for j, tok in enumerate(p)]
        last = torch.cat([self._decode(entries[i:i + BATCH_TOKENS]) for i in range(0, len(entries), BATCH_TOKENS)])  # (B, V)
        for b in range(len(prompts)):
            for j in range(1, n):
                self.L.llama_memory_seq_cp(self.mem, b * n, b * n + j, -1, -1)
        self.rows = list(range(len(prompts) * n))
        self.pos = [len(prompts[r // n]) for r in self.rows]
        return last.repeat_interleave(n, dim=0)  # (B*n, V)

    def keep(self, rows: torch.Tensor) -> None:
        kept = set(rows.tolist())
        for i, seq in enumerate(self.rows):
            if i not in kept:
                self.L.llama_memory_seq_rm(self.mem, seq, -1, -1)
        self.rows = [self.rows[i] for i in sorted(kept)]
        self.pos = [self.pos[i] for i in sorted(kept)]

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        logits = self._decode([(int(t), p, seq, True) for t, p, seq in zip(tokens.tolist(), self.pos, self.rows)])  # (A, V)
        self.pos = [p + 1 for p in self.pos]
        return logits

    def _decode(self, entries: list[tuple[int, int, int, bool]]) -> torch.Tensor:
        """One `llama_decode` of (token, position, sequence, wants logits) entries; the logits of
        those that want them, in order, as a (k, V) float tensor."""
        b = self.batch
        b.n_tokens = len(entries)
        for i, (tok, pos, seq, wants) in enumerate(entries):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = tok, pos, 1, wants
            b.seq_id[i][0] = seq
        rc = self.L.llama_decode(self.served.ctx, b)
        if rc != 0:
            raise RuntimeError(f"llama_decode failed ({rc}) on {len(entries)} tokens")
        wanted = sum(1 for e in entries if e[3])
        if not wanted:
            return torch.empty((0, self.served.vocab))
        ptr = self.L.llama_get_logits(self.served.ctx)
        return torch.from_numpy(np.ctypeslib.as_array(ptr, shape=(wanted, self.served.vocab)).copy())


def _chunks(prompts: list[list[int]], n: int) -> list[list[list[int]]]:
    """The prompts in runs of consecutive ones whose rows fit in one batch (`MAX_SEQUENCES`)."""
    if n > MAX_SEQUENCES:
        raise ValueError(f"generation.backend llamacpp decodes at most {MAX_SEQUENCES} candidates of a prompt at once; asked for {n}")
    per = MAX_SEQUENCES // n
    return [prompts[i:i + per] for i in range(0, len(prompts), per)]


def _view(tensor: Any) -> torch.Tensor:
    """A flat torch view of a GGUF tensor's bytes in the (writable, shared) mapping."""
    import gguf

    raw = np.asarray(tensor.data).reshape(-1)
    kind = tensor.tensor_type
    if kind == gguf.GGMLQuantizationType.F32:
        return torch.from_numpy(raw.view(np.float32))
    if kind == gguf.GGMLQuantizationType.F16:
        return torch.from_numpy(raw.view(np.float16))
    if kind == gguf.GGMLQuantizationType.BF16:
        return torch.from_numpy(raw.view(np.int16)).view(torch.bfloat16)
    raise ValueError(f"GGUF tensor {tensor.name} is {kind.name}; the llama.cpp backend writes F32, F16 and BF16 tensors only")


def _converter(architecture: str) -> Any:
    """llama.cpp's converter class for the architecture, writing a placeholder vocabulary (byte
    tokens for ids 0-255, then one name per id): llama.cpp is only ever handed token ids here."""
    import gguf

    from training.gguf_conversion import gguf_converter_class

    base = gguf_converter_class(architecture)

    class Weights(base):  # type: ignore[misc, valid-type]
        model_arch = base.model_arch  # the converter's subclasses must name it themselves

        def set_vocab(self) -> None:
            size = int(self.hparams["vocab_size"])
            self.gguf_writer.add_tokenizer_model("llama")
            self.gguf_writer.add_tokenizer_pre("default")
            self.gguf_writer.add_token_list([f"<0x{i:02X}>" if i < 256 else f"<troupe-{i}>" for i in range(size)])
            self.gguf_writer.add_token_scores([0.0] * size)
            self.gguf_writer.add_token_types([gguf.TokenType.BYTE if i < 256 else gguf.TokenType.NORMAL for i in range(size)])

    return Weights


@ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
def _quiet(level: int, text: bytes, data: Any) -> None:
    """llama.cpp's log callback: its load and context reports stay out of the run's output."""
