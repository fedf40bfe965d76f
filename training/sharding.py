"""`resources.parallel: fsdp`: each trainable model sharded over the launch's ranks with FSDP2.

What changes against data parallel (`training.distributed`), and nothing else does:

- **Build** (`shard_policies`): after `build_policies`, every decoder layer and then the whole
  model go through `torch.distributed.fsdp.fully_shard`, so a rank keeps about 1/N of each
  parameter, its gradient and its AdamW state (the optimizer is rebuilt over the sharded
  parameters). `lora` shards the frozen base and leaves the adapters whole (FSDP's
  `ignored_params`): they are small, their gradients are summed as in data parallel, and PEFT
  saves and loads them as before. A reference model for the KL term is sharded too. Over all
  the launch's ranks (not `lora`, not rank groups) only rank 0 loads the weights: the others
  build the model on the meta device (`builds_on_meta`) and receive their shards from rank 0
  (`set_model_state_dict(..., broadcast_from_rank0=True)`), so no rank but the first ever holds
  the whole model; nothing keeps the whole parameters after sharding
  (`tests/training/test_distributed.py`).
- **Update**: FSDP gathers a layer's weights for its forward and backward and reduce-scatters
  its gradients (summed, not averaged: the loss is already normalised by the global counts).
  Those are collective calls, so every rank runs as many forward and backward passes as the
  busiest rank (`padding_batches`), and the shared-prompt forward, whose pass count depends on
  the batch, is left out (`training.prompt_cache.shares_prompts`).
- **Generation** (`full_weights`): each rank generates its own tasks, a different number of
  forwards per rank, so the weights are gathered once before the rollout and held until it ends
  (`FSDPModule.unshard` with `reshard_after_forward` off), then resharded for the update.
- **Checkpoints** (`save_models`, `restore_models`): besides the Hugging Face folder of each
  policy (gathered to a full state dict and written by the group's first rank, so exports,
  evaluation and the playground read it as before), the sharded model and optimizer state go to
  `dcp/<policy>/` with torch's distributed checkpoint. It loads on any number of ranks (2 -> 1,
  1 -> 2), into a sharded model or a plain one.

`training.placement` puts each `full` agent's model on a group of ranks; the functions here then
run on that group (its process group and device mesh).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as torch_dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor

from training.config import ConfigError, RunConfig
from training.models import no_progress_bars
from training.policies import Policy, PolicySet, _prepare

if TYPE_CHECKING:
    from training.distributed import Dist

DCP_DIR = "dcp"
"""A checkpoint's folder of distributed checkpoints, one `dcp/<policy>/` per sharded policy."""
_SHARDED = "_troupe_fsdp_root"
"""Attribute of a policy's model: the module `fully_shard` made the FSDP root (for `lora` the
base inside PEFT's wrapper)."""


def uses_dcp(config: RunConfig, policy: Policy) -> bool:
    """Whether a checkpoint keeps this policy's state as a distributed checkpoint: its weights are
    sharded (`fsdp`, a whole model) or live on a rank group (`resources.placement`)."""
    return (config.resources.parallel == "fsdp" and policy.adapter is None) or bool(config.resources.placement)


def is_sharded(model: Any) -> bool:
    return getattr(model, _SHARDED, None) is not None


def _broadcasts(config: RunConfig, dist: Dist, placement: Any) -> bool:
    """Whether `shard_policies` loads every rank's shards from rank 0's whole weights: `fsdp` over
    all the launch's ranks (not rank groups) for a whole model (not `lora`'s shared base)."""
    return (
        config.resources.parallel == "fsdp"
        and dist.world > 1
        and not placement
        and config.topology.specialization != "lora"
        and torch_dist.is_initialized()
    )


def builds_on_meta(config: RunConfig, dist: Dist, placement: Any = None) -> bool:
    """Whether this rank builds its models on the meta device (`build_policies(meta=True)`): it
    receives its shards from rank 0 in `shard_policies`, and never holds the whole weights."""
    return _broadcasts(config, dist, placement) and dist.rank != 0


def shard_policies(policies: PolicySet, config: RunConfig, dist: Dist, placement: Any = None) -> None:
    """Shard every model this rank holds over its ranks (all of them, or its agent's group).
    Over all the ranks (`_broadcasts`), rank 0's whole weights are then broadcast into every
    rank's shards: a model built on the meta device gets its values there."""
    if config.resources.parallel != "fsdp" or not torch_dist.is_initialized():
        return
    broadcast = _broadcasts(config, dist, placement)
    done: set[int] = set()
    for policy in policies.policies.values():
        if policy.model is None or id(policy.model) in done:  # a placed agent's model lives elsewhere
            continue
        done.add(id(policy.model))
        mesh = _mesh(placement.group(policy.name) if placement else None)
        lora = {p for n, p in policy.model.named_parameters() if "lora_" in n}
        for model in (policy.model, policy.ref_model):
            if model is None:
                continue
            whole = model.state_dict() if broadcast and dist.rank == 0 else {}
            _shard(model, mesh, lora if model is policy.model else set())
            if broadcast:
                _load_from_rank0(model, whole, mesh)
            del whole
        for other in policies.policies.values():  # rebuild each optimizer over the sharded parameters
            if other.model is policy.model:
                _prepare(other, config)


def _load_from_rank0(model: torch.nn.Module, whole: dict[str, Any], mesh: DeviceMesh) -> None:
    """Fill a sharded model's shards (and its buffers, such as the rotary frequencies, which no
    state dict holds) from rank 0's whole state dict `whole` (empty on the other ranks)."""
    if any(t.is_meta for t in [*model.parameters(), *model.buffers()]):
        model.to_empty(device=mesh.device_type)
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, whole, options=options)
    for buffer in model.buffers():
        torch_dist.broadcast(buffer, src=0)


def _mesh(group: Any) -> DeviceMesh:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return DeviceMesh.from_group(group or torch_dist.group.WORLD, device)  # type: ignore[arg-type]


def _shard(model: torch.nn.Module, mesh: DeviceMesh, ignored: set[torch.nn.Parameter]) -> None:
    """`fully_shard` each decoder layer (transformers' `_no_split_modules`), then the model."""
    root: Any = model.get_base_model() if hasattr(model, "get_base_model") else model  # type: ignore[operator]  # PEFT: the transformers model
    layer_types = set(getattr(root, "_no_split_modules", None) or ())
    if not layer_types:
        raise ConfigError("resources.parallel", f"fsdp: {type(root).__name__} names no decoder layer class (_no_split_modules) to shard by")
    for module in list(root.modules()):
        if type(module).__name__ in layer_types:
            fully_shard(module, mesh=mesh, ignored_params=ignored or None)
    fully_shard(root, mesh=mesh, ignored_params=ignored or None)
    for module in root.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)  # sum over ranks: the loss is normalised by global counts
            module.set_force_sum_reduction_for_comms(True)  # a plain SUM (gloo has no pre-multiplied sum)
    object.__setattr__(model, _SHARDED, root)  # not a submodule: the model would contain itself


def local_share(model: torch.nn.Module) -> tuple[int, int]:
    """(parameters this rank stores, parameters of the whole model)."""
    mine = total = 0
    for p in model.parameters():
        total += p.numel()
        mine += p.to_local().numel() if isinstance(p, DTensor) else p.numel()
    return mine, total


def clip_grad_norm(params: list[torch.nn.Parameter], max_norm: float) -> float:
    """`clip_grad_norm_` over plain or sharded parameters; the norm of the whole gradient."""
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    return float(norm.full_tensor() if isinstance(norm, DTensor) else norm)


def padding_batches(model: Any, n_batches: int, dist: Dist) -> int:
    """How many empty micro-batches this rank adds so that every rank of a sharded model runs as
    many forward and backward passes (each gathers weights over the ranks)."""
    if not is_sharded(model) or not dist.enabled:
        return 0
    return int(dist.max(float(n_batches))) - n_batches


def _fsdp_modules(model: Any) -> list[FSDPModule]:
    root = getattr(model, _SHARDED, None)
    return [m for m in root.modules() if isinstance(m, FSDPModule)] if root is not None else []


@contextlib.contextmanager
def full_weights(policies: PolicySet) -> Iterator[None]:
    """Hold every sharded model's whole weights on each rank (gathered once, collectively) until the
    block ends, so ranks can generate on their own: a forward then gathers nothing."""
    modules: list[tuple[FSDPModule, bool]] = []
    seen: set[int] = set()
    for policy in policies.policies.values():
        if policy.model is None or id(policy.model) in seen:
            continue
        seen.add(id(policy.model))
        root = getattr(policy.model, _SHARDED, None)
        for m in _fsdp_modules(policy.model):
            m.unshard()
            m.set_reshard_after_forward(False)
            modules.append((m, m is not root))  # FSDP keeps the root unsharded after its forward anyway
    try:
        yield
    finally:
        for m, reshard_after_forward in modules:
            m.reshard()
            m.set_reshard_after_forward(reshard_after_forward)


# -- checkpoints --------------------------------------------------------------------------------


def save_models(policies: PolicySet, folder: Path, config: RunConfig, dist: Dist, placement: Any = None) -> set[str]:
    """Write the state of every policy `uses_dcp` names into `folder` (a checkpoint being written):
    `dcp/<policy>/` from every rank of its group, and the HF folder `<policy>/` from the group's
    first rank. Collective over the launch. Returns those policies' names: the caller writes the
    rest (adapters, unsharded models) as before."""
    names: set[str] = set()
    for policy in policies.policies.values():
        if not uses_dcp(config, policy):
            continue
        names.add(policy.name)
        if policy.model is None:
            continue  # placed on another group
        group = placement.group(policy.name) if placement else None
        first = placement.leads(policy.name) if placement else dist.main
        distributed = torch_dist.is_initialized()
        dcp.save(_state(policy), checkpoint_id=folder / DCP_DIR / policy.name, process_group=group, no_dist=not distributed)
        full: dict[str, Any] | None = None
        if distributed and is_sharded(policy.model):
            # every rank of the group gets the whole tensors (`cpu_offload` would keep them on global rank 0 only,
            # which need not be in this group); the generation held them whole on each rank already
            whole = get_model_state_dict(policy.model, options=StateDictOptions(full_state_dict=True))
            full = {k: v.cpu() for k, v in whole.items() if isinstance(v, torch.Tensor)} if first else None
        if first:
            target = folder / policy.name
            with no_progress_bars(), _writes_here(policy.model):
                policy.model.save_pretrained(str(target), state_dict=full, safe_serialization=True)
            policy.tokenizer.save_pretrained(str(target))
    return names


@contextlib.contextmanager
def _writes_here(model: Any) -> Iterator[None]:
    """Let this rank's `save_pretrained` write: under torch.distributed transformers writes from
    global rank 0 only, and a placed agent's group need not hold rank 0."""
    model.should_save_on_this_rank = lambda is_main_process: is_main_process  # an instance attribute, for this call
    try:
        yield
    finally:
        del model.should_save_on_this_rank


def restore_models(policies: PolicySet, folder: Path, config: RunConfig, dist: Dist, placement: Any = None) -> set[str]:
    """Load `dcp/<policy>/` of a checkpoint into each policy that has one (sharded or plain, any
    number of ranks). Returns the names of the policies done with (loaded, or held on another
    group); the caller loads the others from their HF folders. Refuses a checkpoint without
    distributed state for a policy this run shards: its optimizer state would be lost."""
    names: set[str] = set()
    for policy in policies.policies.values():
        source = folder / DCP_DIR / policy.name
        if not source.is_dir():
            if uses_dcp(config, policy):
                raise ConfigError(
                    "checkpoint.resume_from",
                    f"{folder} has no distributed checkpoint of policy {policy.name!r} ({DCP_DIR}/{policy.name}/): it was saved by a "
                    "run without resources.parallel fsdp or placement. Resume it with the run's own settings",
                )
            continue
        names.add(policy.name)
        if policy.model is None:
            continue
        state = _state(policy)
        group = placement.group(policy.name) if placement else None
        dcp.load(state, checkpoint_id=source, process_group=group, no_dist=not torch_dist.is_initialized())
        if policy.optimizer is not None:
            set_state_dict(policy.model, policy.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        else:
            set_model_state_dict(policy.model, state["model"])
    return names


def _state(policy: Policy) -> dict[str, Any]:
    """The policy's model (and optimizer) state as DCP saves and loads it: keyed by parameter
    names, each tensor this rank's shard."""
    if policy.optimizer is None:
        return {"model": get_model_state_dict(policy.model)}
    model_state, optim_state = get_state_dict(policy.model, policy.optimizer)
    return {"model": model_state, "optim": optim_state}
