"""Batched sampling with the prompt prefill shared by the K candidates of a group.

`generate` takes B distinct prompts and returns n samples for each. The prompts are prefilled
once (B rows, not B*n); the KV cache is then repeated n times and decoding runs over all B*n
rows together, in inference mode. A row that ends (end-of-turn token or stop pattern) leaves
the batch and the KV cache, so the rows still running do not pay for the finished ones.
Temperature 0 is greedy. This is the HF backend; vLLM
(GPU only) plugs in behind the same function in `training.vllm_backend`.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase
from transformers.cache_utils import DynamicLayer


@dataclass(frozen=True)
class Generation:
    token_ids: tuple[int, ...]
    """Completion tokens, including the end-of-turn token when the model produced one."""
    text: str
    """Decoded completion without special tokens."""
    truncated: bool
    """True when the completion hit max_new_tokens before an end-of-turn token (with tool calls:
    when one of its segments did, see `segment_tokens`)."""
    logprobs: tuple[float, ...] | None = None
    """The sampler's log-prob of each completion token at the sampling temperature, when the
    sampler is not the trainer (vLLM, or the HF backend's lagging sampler of
    `generation.async`); None when the sampler's weights are the trainer's."""
    mask: tuple[int, ...] | None = None
    """1 for each token of `token_ids` the model wrote, 0 for a tool result spliced in between
    (`training.tool_turns`); None: every token is the model's."""
    calls: tuple[dict[str, Any], ...] = ()
    """The tool calls made in this completion, in order (`agents.tools.ToolCall.to_dict`)."""
    segments: tuple[str, ...] = ()
    """With tool calls: the model's text of each segment; call i came after segment i."""
    segment_tokens: tuple[int, ...] = ()
    """With tool calls: the model's tokens in each segment (each one generation, capped at
    max_new_tokens on its own); empty: one segment of `model_tokens`."""

    @property
    def model_tokens(self) -> int:
        """How many of `token_ids` the model wrote (what the loss and `completion_len` count)."""
        return len(self.token_ids) if self.mask is None else sum(self.mask)

    @property
    def longest_segment(self) -> int:
        """The model's tokens in its longest segment: what max_new_tokens caps."""
        return max(self.segment_tokens, default=self.model_tokens)


@dataclass
class GenerationStats:
    tokens: int = 0
    seconds: float = 0.0


def stop_token_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    ids: set[int] = set()
    for source in (tokenizer.eos_token_id, getattr(model.generation_config, "eos_token_id", None)):
        if isinstance(source, int):
            ids.add(source)
        elif isinstance(source, (list, tuple)):
            ids.update(int(i) for i in source)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>") if "<|im_end|>" in tokenizer.get_vocab() else None
    if isinstance(im_end, int):
        ids.add(im_end)
    return sorted(ids)


@torch.inference_mode()
def generate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[list[int]],
    *,
    n: int,
    max_new_tokens: int,
    temperature: float,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
    stats: GenerationStats | None = None,
    stop: re.Pattern[str] | None = None,
    stop_check_every: int = 4,
    logprobs: bool = False,
    kv_cache: str = "dynamic",
) -> list[list[Generation]]:
    """Sample `n` completions for each prompt (token ids). Returns one list of n per prompt.

    `stop`: a completion also ends as soon as its decoded text matches this pattern (checked
    every `stop_check_every` tokens; the completion keeps the tokens generated until then), for
    example after the closing fence of a code block. Such a completion is not `truncated`.

    `logprobs`: also return each sampled token's log-prob under these weights at `temperature`
    (untempered when greedy), as `training.grpo.token_logprobs` scores it: an async sampler whose
    weights lag the trainer's (`training.async_rollout`) hands them to the importance weights.

    `kv_cache`: "dynamic" (transformers' DynamicCache, which copies every layer's whole cache to
    append one position) or "reserved" (each layer's keys and values written in place into room
    reserved for the prompt and `max_new_tokens`, `reserved_cache`). Both compute the same numbers;
    bench/generation.py measures them side by side: on CPU the reserved cache saves the copies but
    attention over its strided views costs as much again (0.95-0.97x), so dynamic stays the default."""
    if kv_cache not in ("reserved", "dynamic"):
        raise ValueError(f"unknown kv_cache {kv_cache!r}; allowed: reserved, dynamic")
    if not prompts:
        return []
    was_training = model.training
    model.eval()
    try:
        return decode(_HFDecoder(model, tokenizer, kv_cache), tokenizer, prompts, n=n, max_new_tokens=max_new_tokens,
                      temperature=temperature, top_p=top_p, generator=generator, stats=stats, stop=stop,
                      stop_check_every=stop_check_every, logprobs=logprobs, stops=stop_token_ids(model, tokenizer))
    finally:
        if was_training:
            model.train()


class Decoder(Protocol):
    """The model's side of `decode`: it holds the batch's KV cache and returns next-token logits.
    The HF backend's is `_HFDecoder`; llama.cpp's is `training.llamacpp_backend`'s."""

    def prefill(self, prompts: list[list[int]], n: int, max_new_tokens: int) -> torch.Tensor:
        """Run the distinct prompts once; the (B*n, V) float logits of each prompt's last position,
        row b*n+j for candidate j of prompt b, each row with its own copy of the prompt's cache."""

    def keep(self, rows: torch.Tensor) -> None:
        """Only `rows` (indices into the batch as it is now) go on decoding; the others leave it."""

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Append one token to each row still in the batch; (A,) -> their (A, V) float logits."""


def decode(
    decoder: Decoder,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[list[int]],
    *,
    n: int,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    generator: torch.Generator | None,
    stats: GenerationStats | None,
    stop: re.Pattern[str] | None,
    stop_check_every: int,
    logprobs: bool,
    stops: list[int],
) -> list[list[Generation]]:
    """`generate`'s loop, for any `Decoder`: sample from the logits (`_sample`), end the rows that
    wrote a stop token or matched `stop`, drop them from the batch, and decode the rest."""
    if not prompts:
        return []
    t0 = time.perf_counter()
    logits = decoder.prefill(prompts, n, max_new_tokens)  # (B*n, V)
    device = logits.device
    stop_ids = torch.tensor(stops, device=device, dtype=torch.long)
    rows = logits.shape[0]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    tokens = torch.full((rows, max_new_tokens), pad_id, dtype=torch.long, device=device)  # (B*n, T)
    finished = torch.zeros(rows, dtype=torch.bool, device=device)  # (B*n,)
    lengths = torch.full((rows,), max_new_tokens, dtype=torch.long, device=device)  # (B*n,)
    token_logp = torch.zeros((rows, max_new_tokens), dtype=torch.float32, device=device) if logprobs else None  # (B*n, T)
    alive = torch.arange(rows, device=device)  # (A,) the rows still decoding; A shrinks as rows finish

    # -- decode: finished rows leave the batch (and the KV cache), so the tail costs what is left --
    for t in range(max_new_tokens):
        nxt = _sample(logits, temperature, top_p, generator)  # (A,)
        tokens[alive, t] = nxt
        if token_logp is not None:
            scaled = logits / temperature if temperature > 0 else logits  # (A, V)
            token_logp[alive, t] = scaled.gather(1, nxt[:, None]).squeeze(1) - torch.logsumexp(scaled, dim=-1)  # (A,)
        done = torch.isin(nxt, stop_ids)  # (A,)
        if stop is not None and (t + 1) % stop_check_every == 0:
            for a, r in enumerate(alive.tolist()):
                if not done[a] and stop.search(str(tokenizer.decode(tokens[r, : t + 1].tolist(), skip_special_tokens=True))):
                    done[a] = True
        lengths[alive[done]] = t + 1
        finished[alive[done]] = True
        if bool(done.all()) or t == max_new_tokens - 1:
            break
        if bool(done.any()):
            keep = (~done).nonzero().flatten()  # (A',)
            alive, nxt = alive[keep], nxt[keep]
            decoder.keep(keep)
        logits = decoder.step(nxt)  # (A, V)

    results: list[list[Generation]] = []
    total = 0
    for b in range(len(prompts)):
        group = []
        for j in range(n):
            r = b * n + j
            length = int(lengths[r])
            ids = tuple(int(x) for x in tokens[r, :length].tolist())
            total += length
            text = str(tokenizer.decode(list(ids), skip_special_tokens=True))
            truncated = not bool(finished[r])
            if truncated and stop is not None and stop.search(text):
                truncated = False  # the pattern completed on the very last token
            lp = tuple(float(x) for x in token_logp[r, :length].tolist()) if token_logp is not None else None
            group.append(Generation(token_ids=ids, text=text, truncated=truncated, logprobs=lp))
        results.append(group)
    if stats is not None:
        stats.tokens += total
        stats.seconds += time.perf_counter() - t0
    return results


class _HFDecoder:
    """A transformers model as `decode`'s `Decoder`: the B prompts are prefilled once (left
    padded, only the last position's logits), the cache is then repeated n times."""

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, kv_cache: str) -> None:
        self.model, self.kv_cache = model, kv_cache
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.device = next(model.parameters()).device
        self.cache: Any = None
        self.mask = self.next_pos = torch.empty(0)

    def prefill(self, prompts: list[list[int]], n: int, max_new_tokens: int) -> torch.Tensor:
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long, device=self.device)  # (B, P)
        mask = torch.zeros((len(prompts), width), dtype=torch.long, device=self.device)  # (B, P)
        for i, p in enumerate(prompts):
            input_ids[i, width - len(p):] = torch.tensor(p, device=self.device)
            mask[i, width - len(p):] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # (B, P)
        cache = reserved_cache(self.model, width + max_new_tokens) if self.kv_cache == "reserved" else None
        out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=positions, past_key_values=cache, use_cache=True,
                         logits_to_keep=1)
        self.cache = out.past_key_values
        logits = out.logits[:, -1, :].float()  # (B, V)
        if n > 1:  # share the prefill across the n candidates
            self.cache.batch_repeat_interleave(n)
            logits = logits.repeat_interleave(n, dim=0)  # (B*n, V)
            mask = mask.repeat_interleave(n, dim=0)  # (B*n, P)
        self.mask, self.next_pos = mask, mask.sum(-1, keepdim=True)  # (B*n, P), (B*n, 1)
        return logits

    def keep(self, rows: torch.Tensor) -> None:
        self.mask, self.next_pos = self.mask[rows], self.next_pos[rows]
        self.cache.batch_select_indices(rows)

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        self.mask = torch.cat([self.mask, self.mask.new_ones((self.mask.shape[0], 1))], dim=1)  # (A, P+t+1)
        out = self.model(input_ids=tokens.unsqueeze(1), attention_mask=self.mask, position_ids=self.next_pos,
                         past_key_values=self.cache, use_cache=True)
        self.cache = out.past_key_values
        self.next_pos = self.next_pos + 1
        return out.logits[:, -1, :].float()  # (A, V)


class _ReservedLayer(DynamicLayer):
    """One layer's keys and values in tensors with room for `capacity` positions, written in place;
    `keys`/`values` are views of the filled part, so attention reads exactly what DynamicLayer's
    concatenated tensors hold. Rows that leave the batch are dropped by copying the filled part once."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity, self.length = capacity, 0
        self._k = self._v = torch.empty(0)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.dtype, self.device = key_states.dtype, key_states.device
            b, h, _, d = key_states.shape
            self._k = key_states.new_empty((b, h, self.capacity, d))  # (R, H, C, D)
            self._v = value_states.new_empty((b, h, self.capacity, value_states.shape[-1]))  # (R, H, C, Dv)
            self.is_initialized = True
        end = self.length + key_states.shape[-2]
        if end > self._k.shape[2]:  # more than was reserved: grow (never on generate's own path)
            self._k, self._v = self._moved(None, max(end, 2 * self._k.shape[2]))
        self._k[:, :, self.length:end] = key_states
        self._v[:, :, self.length:end] = value_states
        self.length = end
        self._views()
        return self.keys, self.values  # type: ignore[return-value]

    def _moved(self, rows: torch.Tensor | None, capacity: int) -> tuple[torch.Tensor, torch.Tensor]:
        out = []
        for t in (self._k, self._v):
            src = t[:, :, : self.length] if rows is None else t[rows, :, : self.length]
            new = t.new_empty((src.shape[0], t.shape[1], capacity, t.shape[3]))
            new[:, :, : self.length] = src
            out.append(new)
        return out[0], out[1]

    def _views(self) -> None:
        self.keys, self.values = self._k[:, :, : self.length], self._v[:, :, : self.length]

    def get_seq_length(self) -> int:
        return self.length

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.is_initialized:
            self._k, self._v = self._k.repeat_interleave(repeats, dim=0), self._v.repeat_interleave(repeats, dim=0)
            self._views()

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.is_initialized:
            self._k, self._v = self._moved(indices, self._k.shape[2])
            self._views()

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError("crop takes the number of positions to remove as a negative integer")
        self.length = max(0, self.length + tokens_to_remove)
        if self.is_initialized:
            self._views()

    def reset(self) -> None:
        self.length = 0
        super().reset()


def reserved_cache(model: PreTrainedModel, capacity: int) -> DynamicCache | None:
    """A DynamicCache for `model` whose layers reserve room for `capacity` positions (`_ReservedLayer`),
    or None (let the model make its own) when the model's cache is not plain full-attention layers
    (sliding windows, linear attention): those keep transformers' own layers."""
    cache = DynamicCache(config=model.config)
    if not cache.layers or any(type(layer) is not DynamicLayer for layer in cache.layers):
        return None
    cache.layers = [_ReservedLayer(capacity) for _ in cache.layers]
    return cache


def _nucleus(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """(R, V) probabilities at `temperature`, those outside the top_p nucleus set to 0 (not renormalised)."""
    probs = torch.softmax(logits / temperature, dim=-1)  # (R, V)
    if top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)  # (R, V)
        keep = sorted_p.cumsum(-1) - sorted_p < top_p  # (R, V) always keeps the top token
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p * keep)  # (R, V)
    return probs


SAMPLE_BLOCK = 512
"""Vocabulary entries per block of `_sample`'s two-level inversion."""


def _sample(logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator | None) -> torch.Tensor:
    """Next token per row from (R, V) logits: greedy at temperature 0, else nucleus sampling.

    One uniform draw per row, inverted through the row's cumulative distribution, instead of
    `torch.multinomial`, which draws an exponential variate for every token of the vocabulary (8 %
    of a CPU decode step, bench/generation.py). The inversion is two-level, in float64 (so the sum
    of 49k probabilities keeps its last digits): the cumulative sums of blocks of `SAMPLE_BLOCK`
    entries pick the block, then the cumulative sum of that block alone picks the token. A float64
    cumulative sum of the whole vocabulary is sequential work, 5 % of a call. A token of
    probability 0 (cut by top_p) is never drawn: the draw inside its block is kept below the
    block's total, and a zero adds nothing to the running sum."""
    if temperature <= 0:
        return logits.argmax(dim=-1)  # (R,)
    probs = _nucleus(logits, temperature, top_p)  # (R, V)
    # the run's seeded generator lives on the CPU: draw there, so a GPU run stays reproducible
    on_cpu = generator is not None and generator.device != probs.device
    p = probs.cpu() if on_cpu else probs
    rows, vocab = p.shape
    blocks = -(-vocab // SAMPLE_BLOCK)
    p = torch.nn.functional.pad(p, (0, blocks * SAMPLE_BLOCK - vocab)).view(rows, blocks, SAMPLE_BLOCK)  # (R, NB, S)
    mass = p.sum(-1, dtype=torch.float64)  # (R, NB)
    cdf = mass.cumsum(-1)  # (R, NB)
    u = torch.rand((rows, 1), generator=generator, dtype=torch.float64, device=cdf.device) * cdf[:, -1:]  # (R, 1)
    block = torch.searchsorted(cdf, u, right=True).clamp_(max=blocks - 1)  # (R, 1)
    u = u - (cdf.gather(1, block) - mass.gather(1, block))  # (R, 1) the draw's place inside its block
    inner = p.gather(1, block[:, :, None].expand(rows, 1, SAMPLE_BLOCK)).squeeze(1).double().cumsum(-1)  # (R, S)
    u = torch.minimum(u.clamp_(min=0.0), torch.nextafter(inner[:, -1:], torch.zeros_like(u)))  # (R, 1) below the block's total
    picked = block.squeeze(1) * SAMPLE_BLOCK + torch.searchsorted(inner, u, right=True).squeeze(1)  # (R,)
    return picked.to(probs.device)


def _multinomial_sample(logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator | None) -> torch.Tensor:
    """The sampler before bench/generation.py: `torch.multinomial` (kept as the benchmark's peer)."""
    if temperature <= 0:
        return logits.argmax(dim=-1)  # (R,)
    probs = _nucleus(logits, temperature, top_p)  # (R, V)
    if generator is not None and generator.device != probs.device:
        return torch.multinomial(probs.float().cpu(), 1, generator=generator).squeeze(1).to(probs.device)  # (R,)
    return torch.multinomial(probs, 1, generator=generator).squeeze(1)  # (R,)
