"""KV caches that let a GRPO group's shared prompt run once, with activation checkpointing on or off.

`token_logprobs` forwards the U distinct prompts of a micro-batch once and the B completions on
top of their keys and values (`grpo._shared_prompt_logits`). transformers' caches are written as
each layer runs. Under activation checkpointing a layer runs a second time in the backward pass to
rebuild its activations, and a cache written again would then hold the prompt twice; transformers
therefore drops the cache of a checkpointed layer (`GradientCheckpointingLayer`) unless the layer
says it only reads it. The two caches below make both forwards safe to replay:

- `PromptCache` keeps each layer's keys and values from the prompt's first run; the backward's
  replay of that layer finds the layer filled and stores nothing (the prompt attends only to
  itself, so the replay's own states are what it needs).
- `CompletionCache` reads them: a layer's update returns [the prompt states of the row's prompt |
  the completion's states] and stores nothing, so a replay returns the same tensors again.

The prompt's states stay at U rows; the gather to B rows runs inside the completion's layers, so
under checkpointing it is recomputed in the backward instead of held. The gradient of the loss
with respect to a prompt's states reaches that prompt's layers through the gather (a closure of
the checkpointed function), which needs PyTorch's non-reentrant checkpoint (the reentrant one
only passes gradients to the function's explicit inputs): `shares_prompts` checks it.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor
from torch.distributed.fsdp import FSDPModule
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer
from transformers.modeling_layers import GradientCheckpointingLayer

REPLAYABLE_LAYERS = (DynamicLayer, DynamicSlidingWindowLayer)
"""Cache layers that hold keys and values only. A model whose cache also holds a recurrent state
(linear attention, Mamba) or an indexer's keys is scored with the plain forward."""


class PromptCache(DynamicCache):
    """Records each layer's prompt keys and values on the first call; a replay stores nothing."""

    def update(self, key_states: Tensor, value_states: Tensor, layer_idx: int, *args: Any, **kwargs: Any) -> tuple[Tensor, Tensor]:
        layer = self.layers[layer_idx] if layer_idx < len(self.layers) else None
        if isinstance(layer, DynamicLayer) and layer.is_initialized:  # the backward's replay
            return key_states, value_states  # (U, H, P, D) each
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)  # type: ignore[no-any-return]


class CompletionCache(DynamicCache):
    """Reads a filled `PromptCache`, row `i` seeing prompt `rows[i]`; stores nothing."""

    def __init__(self, prompts: PromptCache, rows: Tensor):
        super().__init__()
        self.layers = prompts.layers  # the same layer objects: sequence lengths and mask sizes are the prompt's
        self.layer_class_to_replicate = None
        self.rows = rows  # (B,) index into the U prompts

    def update(self, key_states: Tensor, value_states: Tensor, layer_idx: int, *args: Any, **kwargs: Any) -> tuple[Tensor, Tensor]:
        layer = self.layers[layer_idx]
        assert isinstance(layer, DynamicLayer) and layer.keys is not None and layer.values is not None, "a filled PromptCache layer"
        keys = torch.cat([layer.keys[self.rows], key_states], dim=-2)  # (B, H, P + Tc, D)
        values = torch.cat([layer.values[self.rows], value_states], dim=-2)  # (B, H, P + Tc, D)
        return keys, values


def shares_prompts(model: Any, cache: PromptCache) -> bool:
    """Whether the shared-prompt forward gives `model` the plain forward's values and gradients:
    a cache of keys and values only, and, where layers checkpoint, the non-reentrant checkpoint.
    Never for a model sharded with FSDP (`training.sharding`): its two forwards would gather the
    weights a different number of times on a rank whose batch shares no prompt."""
    if not cache.layers or not all(type(layer) in REPLAYABLE_LAYERS for layer in cache.layers):
        return False
    for module in model.modules():
        if isinstance(module, FSDPModule):
            return False
        if isinstance(module, GradientCheckpointingLayer) and module.gradient_checkpointing:
            fn = getattr(module, "_gradient_checkpointing_func", None)
            if not (isinstance(fn, functools.partial) and fn.keywords.get("use_reentrant") is False):
                return False
    return True


@contextlib.contextmanager
def cache_through_checkpoints(model: Any) -> Iterator[bool]:
    """Let checkpointed layers keep the cache they are given (both caches above are replay-safe);
    outside this block transformers drops it, as it must for its own caches. Yields whether the
    layers checkpoint now (train mode): the model's `use_cache` is then to be False, as
    transformers would set it (with a warning), the caches being passed explicitly."""
    layers = [
        m
        for m in model.modules()
        if isinstance(m, GradientCheckpointingLayer) and m.gradient_checkpointing and m.training and not m._can_checkpoint_with_cache
    ]
    for layer in layers:
        layer._can_checkpoint_with_cache = True
    try:
        yield bool(layers)
    finally:
        for layer in layers:
            del layer._can_checkpoint_with_cache  # back to the class's False
