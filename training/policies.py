"""Policies: which weights each agent acts with and which weights its samples update.

The four specializations (PettingLLMs' levels) differ only here:

- `single` (L0) and `prompt` (L1): one model, one optimizer; every acting agent uses it and
  roles differ only by their instructions. A non-trainable agent's samples are left out.
- `lora` (L2): one frozen base wrapped by PEFT with one adapter per agent, named after the
  agent; each adapter has its own optimizer and is updated only by its own agent's samples.
  The reference policy for KL is the base with adapters disabled.
- `full` (L3): one model and optimizer per agent; agents may name different base models.

Multi-agent is a batch dimension: the trainer groups samples by policy and calls the same
update for each.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from peft import LoraConfig as PeftLoraConfig
from peft import PeftModel, get_peft_model, get_peft_model_state_dict, prepare_model_for_kbit_training, set_peft_model_state_dict
from safetensors.torch import load_file
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from training.config import RunConfig
from training.models import load_model, load_tokenizer, no_progress_bars

SHARED = "shared"


@dataclass
class Policy:
    """One set of trainable weights (a whole model, or one LoRA adapter on a shared base)."""

    name: str
    """`shared` for single/prompt, else the agent's name (its adapter or model is named after it)."""
    model: PreTrainedModel
    """The module to call; for `lora` the PeftModel shared by every adapter policy. None on a rank
    that does not hold it (`resources.placement`, `training.placement`)."""
    tokenizer: PreTrainedTokenizerBase
    agents: tuple[str, ...]
    """Agents acting with this policy."""
    trainable: bool
    adapter: str | None = None
    """PEFT adapter to activate before using `model` (lora only)."""
    optimizer: torch.optim.Optimizer | None = None
    params: list[torch.nn.Parameter] = field(default_factory=list)
    ref_model: PreTrainedModel | None = None
    """Frozen reference copy for the KL term (single/prompt/full with beta > 0)."""
    ref_adapter: str | None = None
    """lora: a frozen adapter holding the weights the run started from (`pin_reference`), the
    reference for the KL term; None: the base with the adapters disabled (a fresh adapter is the
    identity, so that is the starting policy)."""

    @contextlib.contextmanager
    def active(self) -> Iterator[PreTrainedModel]:
        """Use this policy's weights: activates its adapter on a shared PEFT model."""
        if self.adapter is not None:
            assert isinstance(self.model, PeftModel)
            self.model.set_adapter(self.adapter)
            # PEFT's set_adapter marks the active adapter trainable; frozen agents stay frozen.
            if not self.trainable:
                self.model.set_requires_grad(self.adapter, requires_grad=False)
        yield self.model

    @contextlib.contextmanager
    def reference(self) -> Iterator[PreTrainedModel]:
        """The frozen reference policy for the KL penalty: the policy the run started from."""
        if self.adapter is not None and self.ref_adapter is not None:
            assert isinstance(self.model, PeftModel)
            self.model.set_adapter(self.ref_adapter)
            try:
                yield self.model
            finally:
                with self.active():  # back to this policy's adapter, trainable as before
                    pass
                self.model.set_requires_grad(self.ref_adapter, requires_grad=False)
        elif self.adapter is not None:
            assert isinstance(self.model, PeftModel)
            with self.model.disable_adapter():
                yield self.model
        else:
            assert self.ref_model is not None, "reference model is only built when grpo.beta > 0"
            yield self.ref_model

    def pin_reference(self) -> None:
        """Make the weights this policy holds now (a warm start's, `model.init_from`) its KL
        reference, as GRPO and TRL measure the KL to the policy a run starts from: copied into the
        reference model, or (lora) into a frozen adapter of its own beside the policy's."""
        if self.ref_model is not None:
            self.ref_model.load_state_dict(self.model.state_dict())
        elif self.adapter is not None:
            assert isinstance(self.model, PeftModel)
            name = self.ref_adapter or f"{self.adapter}@reference"  # `@` is in no agent's name: no adapter has it
            if self.ref_adapter is None:
                self.model.add_adapter(name, self.model.peft_config[self.adapter])
            set_peft_model_state_dict(self.model, get_peft_model_state_dict(self.model, adapter_name=self.adapter), adapter_name=name)
            self.model.set_requires_grad(name, requires_grad=False)
            self.ref_adapter = name


@dataclass
class PolicySet:
    policies: dict[str, Policy]
    agent_policy: dict[str, str]
    """Agent name -> policy name."""
    specialization: str

    def for_agent(self, agent: str) -> Policy:
        return self.policies[self.agent_policy[agent]]

    def trainable(self) -> list[Policy]:
        return [p for p in self.policies.values() if p.trainable]


def resolve_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def build_policies(config: RunConfig, *, device: torch.device | None = None, only: set[str] | None = None, meta: bool = False) -> PolicySet:
    """Load the models a run needs and attach adapters and optimizers per its specialization.
    `only` (`full`, under `resources.placement`): the agents whose models this rank holds; the
    others get their tokenizer and no model (`Policy.model` None: they generate elsewhere).
    `meta` (`single`, `prompt`, `full`): build the models on the meta device, weights unread, for
    `training.sharding.shard_policies` to fill with this rank's shard (`sharding.builds_on_meta`)."""
    device = device or resolve_device()
    topo = config.topology
    acting = list(dict.fromkeys(topo.order()))
    agents = [config.agent(name) for name in acting]
    need_ref = config.grpo.beta > 0

    if topo.specialization in ("single", "prompt"):
        model, tok = load_model(config.model.source, dtype=config.model.dtype, device=device, meta=meta)
        trainable = any(a.trainable for a in agents)
        policy = Policy(SHARED, model, tok, tuple(acting), trainable)
        if need_ref and trainable:
            policy.ref_model = _frozen_copy(model)
        _prepare(policy, config)
        return PolicySet({SHARED: policy}, {a: SHARED for a in acting}, topo.specialization)

    if topo.specialization == "lora":
        base, tok = load_model(config.model.source, dtype=config.model.dtype, device=device, quantization=config.model.quantization)
        for p in base.parameters():
            p.requires_grad_(False)
        if config.model.quantization != "none":  # QLoRA: norms in float32, inputs that carry gradients
            base = prepare_model_for_kbit_training(
                base, use_gradient_checkpointing=config.model.gradient_checkpointing, gradient_checkpointing_kwargs=CHECKPOINT_KWARGS
            )
        lcfg = config.lora
        peft_cfg = PeftLoraConfig(
            r=lcfg.r,
            lora_alpha=lcfg.alpha,
            lora_dropout=lcfg.dropout,
            target_modules=list(lcfg.target_modules),
            task_type="CAUSAL_LM",
        )
        torch.manual_seed(config.seed)  # adapter init (B is zero, A is seeded) is reproducible
        peft_model = get_peft_model(base, peft_cfg, adapter_name=agents[0].name)
        for a in agents[1:]:
            peft_model.add_adapter(a.name, peft_cfg)
        policies = {}
        for a in agents:
            pol = Policy(a.name, peft_model, tok, (a.name,), a.trainable, adapter=a.name)  # type: ignore[arg-type]
            _prepare(pol, config)
            policies[a.name] = pol
        return PolicySet(policies, {a.name: a.name for a in agents}, "lora")

    if topo.specialization == "full":
        policies = {}
        for i, a in enumerate(agents):
            if only is not None and a.name not in only:
                policies[a.name] = Policy(a.name, None, load_tokenizer(config.agent_model(a)), (a.name,), a.trainable)  # type: ignore[arg-type]
                continue
            model, tok = load_model(config.agent_model(a), dtype=config.model.dtype, device=_agent_device(config, i, device), meta=meta)
            pol = Policy(a.name, model, tok, (a.name,), a.trainable)
            if need_ref and a.trainable:
                pol.ref_model = _frozen_copy(model)
            _prepare(pol, config)
            policies[a.name] = pol
        return PolicySet(policies, {a.name: a.name for a in agents}, "full")

    raise ValueError(f"unknown specialization {topo.specialization!r}")


def _agent_device(config: RunConfig, index: int, device: torch.device) -> torch.device:
    """`resources.parallel: agents` puts the i-th agent's model on GPU i mod `resources.gpus`."""
    res = config.resources
    if res.parallel == "agents" and res.gpus > 1 and device.type == "cuda":
        return torch.device("cuda", index % res.gpus)
    return device


def _frozen_copy(model: PreTrainedModel) -> PreTrainedModel:
    ref = copy.deepcopy(model)
    ref.eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


CHECKPOINT_KWARGS = {"use_reentrant": False}
"""PyTorch's non-reentrant activation checkpoint: gradients reach tensors a checkpointed layer
reads from outside its arguments (the shared prompt's keys and values, `training.prompt_cache`),
and a frozen embedding needs no `enable_input_require_grads` for LoRA's gradients to flow (the
reentrant checkpoint would pass none to a layer whose inputs do not require grad)."""


def _prepare(policy: Policy, config: RunConfig) -> None:
    """Collect the policy's trainable parameters and give it an AdamW optimizer; switch dropout
    off (`grpo.disable_dropout`) and activation checkpointing on (`model.gradient_checkpointing`)."""
    model = policy.model
    if config.grpo.disable_dropout:
        disable_dropout(model)
    if config.model.gradient_checkpointing and policy.trainable and not model.is_activation_checkpointing:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=CHECKPOINT_KWARGS)
    if policy.adapter is not None:
        params = [p for n, p in model.named_parameters() if is_adapter_param(n, policy.adapter)]
        for p in params:
            p.requires_grad_(policy.trainable)
    else:
        params = list(model.parameters())
        for p in params:
            p.requires_grad_(policy.trainable)
    policy.params = params if policy.trainable else []
    if policy.trainable:
        policy.optimizer = torch.optim.AdamW(
            policy.params, lr=config.optim.lr, weight_decay=config.optim.weight_decay, betas=(config.optim.adam_beta1, config.optim.adam_beta2), eps=config.optim.adam_eps
        )


def is_adapter_param(name: str, adapter: str) -> bool:
    """Whether the parameter `name` is one of `adapter`'s LoRA weights: a layer's
    `...lora_A.<adapter>.weight` (a Linear per adapter) or an embedding's
    `...lora_embedding_A.<adapter>` (a Parameter per adapter, `lora.target_modules: [embed_tokens]`)."""
    return "lora_" in name and name.endswith((f".{adapter}.weight", f".lora_embedding_A.{adapter}", f".lora_embedding_B.{adapter}"))


def disable_dropout(model: torch.nn.Module) -> None:
    """Set every dropout probability of `model` to zero, so a forward in train mode (which the
    update needs for activation checkpointing) is deterministic. Like TRL's
    `disable_dropout_in_model` it zeroes each `nn.Dropout` (LoRA's dropout included); it also
    zeroes the float probabilities attention modules keep for themselves (`attention_dropout` in
    Llama, Qwen and Mistral), which TRL's leaves on. The model's config is not changed, so saved
    checkpoints keep their dropout."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        for name, value in list(vars(module).items()):
            if "dropout" in name and isinstance(value, float):
                setattr(module, name, 0.0)


# -- checkpoints ----------------------------------------------------------------------------------


def save_policies(policies: PolicySet, folder: Path, *, skip: Collection[str] = ()) -> None:
    """Save each policy in HF/PEFT format: `folder/<agent>/` (an adapter or a full model);
    `folder/shared/` for single/prompt. Those named in `skip` are written already
    (`training.sharding.save_models`)."""
    folder.mkdir(parents=True, exist_ok=True)
    for pol in policies.policies.values():
        if pol.name in skip:
            continue
        target = folder / pol.name
        if pol.adapter is not None:
            assert isinstance(pol.model, PeftModel)
            tmp = folder / f".{pol.name}.tmp"
            # The vocabulary is never resized, so an adapter on `embed_tokens` saves its LoRA
            # weights alone: peft's `auto` would add the whole base embedding (113 MB for SmolLM2).
            pol.model.save_pretrained(str(tmp), selected_adapters=[pol.adapter], save_embedding_layers=False)
            # PEFT writes non-default adapters into a subfolder named after the adapter.
            src = tmp / pol.adapter if (tmp / pol.adapter).is_dir() else tmp
            src.rename(target)
            _rmtree(tmp)
        else:
            with no_progress_bars():  # "Writing model shards" at every checkpoint, a line each on a log
                pol.model.save_pretrained(str(target), safe_serialization=True)
        pol.tokenizer.save_pretrained(str(target))


def load_policy_weights(policies: PolicySet, folder: str | Path, *, skip: Collection[str] = ()) -> None:
    """Load weights saved by `save_policies` into already-built policies (for resume/eval), but
    not those named in `skip` (loaded from a distributed checkpoint: `training.sharding`)."""
    folder = Path(folder)
    for pol in policies.policies.values():
        if pol.name in skip:
            continue
        src = folder / pol.name
        if not src.is_dir():
            raise FileNotFoundError(f"checkpoint {folder} has no folder for policy {pol.name!r}")
        load_policy_folder(pol, src)


def load_policy_folder(pol: Policy, src: Path) -> None:
    """Load one policy's weights from its folder as `save_policies` wrote it: an adapter into its
    PEFT adapter, a full model's safetensors into the model."""
    if pol.adapter is not None:
        assert isinstance(pol.model, PeftModel)
        state = load_file(str(src / "adapter_model.safetensors"))
        result = set_peft_model_state_dict(pol.model, state, adapter_name=pol.adapter)
        unexpected = getattr(result, "unexpected_keys", [])
        if unexpected:
            raise RuntimeError(f"adapter {pol.adapter}: unexpected keys in checkpoint: {unexpected[:3]}")
    else:
        files = sorted(f for f in src.glob("*.safetensors") if f.name != "adapter_model.safetensors")
        if not files:
            raise FileNotFoundError(f"no safetensors weights in {src}")
        state = {}
        for f in files:
            state.update(load_file(str(f)))
        missing, unexpected = pol.model.load_state_dict(state, strict=False)
        # tied embeddings are saved once; anything else missing is an error
        real_missing = [k for k in missing if "lm_head" not in k]
        if real_missing or unexpected:
            raise RuntimeError(f"policy {pol.name}: checkpoint mismatch (missing {real_missing[:3]}, unexpected {unexpected[:3]})")


def _rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)
