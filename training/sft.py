"""Supervised fine-tuning (`algorithm: sft`): each agent learns to write its own assistant turns.

    read conversations -> give each to its agent -> tokenize with assistant masks -> per step, for
    each trained policy: a batch of its agents' conversations -> masked cross-entropy -> one
    optimizer step -> report (loss and token accuracy per agent) -> evaluate / checkpoint

The loss is TRL's SFTTrainer loss with `assistant_only_loss=True`: the mean negative log-likelihood
of the assistant tokens of the whole step's batch (system, user and tool messages, and other
agents' turns, are context only):

    L = - sum_{b,t} m_bt log p(x_bt | x_b<t) / sum_{b,t} m_bt        m_bt = 1 on assistant tokens

Micro-batches accumulate gradients, each weighted by its share of the batch's assistant tokens, so
the step equals one pass over the whole batch (TRL's `num_items_in_batch`). Tested against TRL on
the same batch (tests/training/test_sft_exactness.py).

Where the masks come from: TRL reads them from `{% generation %}` blocks in the chat template, and
for a template without them it swaps in the training twin it ships (Qwen, Llama 3, Gemma, Phi,
DeepSeek, ...). `encode` does the same (`masking_template`), so those templates get TRL's masks
exactly (tested against each twin). For a template TRL does not know (the bundled SmolLM2's), each
assistant message's learned span is its content and its end-of-turn token, found in the rendered
text: from where the conversation before it, rendered with a generation prompt, ends (for an
opening message, after the assistant header: an injected system prompt stays context), to its end
of turn. A prompt-completion line (a run's own episode, `encode_completion`) learns its completion
and each end of turn (after a tool call too, as GRPO learns the model's own end-of-turn token), as
TRL's `completion_only_loss` does.

The rest is the GRPO trainer's machinery: policies per specialization (`training.policies`), the
optimizer and learning-rate schedule, checkpoints in HF/PEFT format with optimizer and RNG state
(`training.checkpoints.save_checkpoint`, so a run resumes), held-out evaluation of the topology's
environment at step 0 and at the end, the event sink and the trackers.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from agents.envs import load_environment
from agents.tools import ToolCall, load_tool
from training import tool_turns
from training.checkpoints import check_resume, restore, save_checkpoint
from training.config import RunConfig
from training.conversations import Conversation, by_agent, read_conversations
from training.data import batch_indices, load_tasks
from training.evaluation import evaluate
from training.events import EventSink, StepMetrics, TrainResult
from training.generation import Generation
from training.plan import Plan
from training.policies import Policy, build_policies
from training.progress import RunProgress
from training.rollout import Sampler
from training.seeding import seed_everything
from training.trackers import reporting
from training.update import step_lr
from training.warmstart import init_from

# == tokenization with assistant masks =============================================================


@dataclass(frozen=True)
class Example:
    """One conversation as one agent learns from it."""

    agent: str
    input_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]
    """Per token: 1 the agent's own assistant text (learned), 0 context."""
    line: int = 0


UNSET: Any = object()


def masking_template(tokenizer: Any) -> str | None:
    """The chat template whose `{% generation %}` blocks mark the assistant's tokens, as TRL's
    SFTTrainer masks them (`assistant_only_loss`): the tokenizer's own when it has the blocks, else
    the training twin TRL ships for it (the same text, with the blocks: Qwen, Llama 3, Gemma, Phi,
    DeepSeek, ...); None for a template TRL does not know (the bundled SmolLM2's), which `encode`
    then masks itself."""
    from trl.chat_template_utils import get_training_chat_template, has_generation_markers

    template = tokenizer.chat_template
    if not template:
        return None
    try:
        return get_training_chat_template(tokenizer) or template  # None: the template has the blocks and needs no patch
    except ValueError:  # not one TRL ships a training twin of
        return template if has_generation_markers(template) else None


def encode(tokenizer: Any, messages: Sequence[dict[str, Any]], *, tools: Any = None, max_length: int | None = None,
           template: str | None = UNSET) -> tuple[list[int], list[int]]:
    """(input ids, assistant mask) of a conversation rendered with the tokenizer's chat template.

    With a `masking_template` (pass it to skip looking it up for each conversation) the mask is
    its `{% generation %}` blocks', as TRL's. Otherwise the learned tokens of assistant message i
    are its content (with the tool calls it renders) and its end of turn, nothing the template puts
    around them: its span starts where `render(messages[:i], generation prompt)` ends (for an
    opening message: after the assistant header, past any system prompt the template injects) and
    ends with the first end-of-turn token (`end_of_turn`) after its content (the whole rest of
    `render(messages[:i+1])` when it writes none). A template that renders a conversation's
    beginning differently once more follows cannot be masked this way, and raises ValueError."""
    msgs = list(messages)
    template = masking_template(tokenizer) if template is UNSET else template
    if template is not None:
        out = tokenizer.apply_chat_template(msgs, tools=tools, chat_template=template, tokenize=True, return_dict=True,
                                            return_assistant_tokens_mask=True)
        ids, mask = list(out["input_ids"]), [int(m) for m in out["assistant_masks"]]
        return (ids[:max_length], mask[:max_length]) if max_length is not None else (ids, mask)
    full = tokenizer.apply_chat_template(msgs, tools=tools, tokenize=False)
    end = end_of_turn(tokenizer)
    end_text = tokenizer.decode([end], skip_special_tokens=False) if end is not None else ""
    spans = []
    for i, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        before = tokenizer.apply_chat_template(msgs[:i], tools=tools, tokenize=False, add_generation_prompt=True) if i else ""
        upto = tokenizer.apply_chat_template(msgs[: i + 1], tools=tools, tokenize=False)
        if not (upto.startswith(before) and full.startswith(upto)):
            raise ValueError(f"the chat template renders the conversation before message {i} differently once more follows, "
                             "so its assistant tokens cannot be told apart")
        start = len(before) if i else _opening_start(tokenizer, tools, upto, str(m.get("content") or ""))
        content = str(m.get("content") or "")
        after = start + len(content) if content and upto.startswith(content, start) else start
        stop = upto.find(end_text, after) if end_text else -1
        spans.append((start, stop + len(end_text) if stop >= 0 else len(upto)))
    enc = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    ids = list(enc["input_ids"])
    mask = [int(any(s <= start < e for s, e in spans)) for start, _ in enc["offset_mapping"]]
    if max_length is not None:
        ids, mask = ids[:max_length], mask[:max_length]
    return ids, mask


def _opening_start(tokenizer: Any, tools: Any, upto: str, content: str) -> int:
    """Where an opening assistant message's own text starts in `upto` (the conversation rendered up
    to it): after the assistant header, which is what a generation prompt adds after a user
    message; a system prompt the template injects before it stays context. Falls back to where its
    content starts, then to 0."""
    probe = [{"role": "user", "content": "\x00"}]
    try:
        bare = tokenizer.apply_chat_template(probe, tools=tools, tokenize=False)
        prompted = tokenizer.apply_chat_template(probe, tools=tools, tokenize=False, add_generation_prompt=True)
    except Exception:  # a template may raise anything jinja raises
        bare = prompted = ""
    header = prompted[len(bare):] if isinstance(prompted, str) and isinstance(bare, str) and prompted.startswith(bare) else ""
    if header and (at := upto.find(header)) >= 0:
        return at + len(header)
    at = upto.find(content) if content else -1
    return max(at, 0)


def agent_tools(config: RunConfig, agent: str, tokenizer: Any) -> Any:
    """The tool schemas the agent's template renders (None when it has no tools, or when its
    template cannot render them: then the conversation describes them itself, as a rollout does)."""
    names = config.agent(agent).tools
    if not names or not tool_turns.tool_support(tokenizer):
        return None
    return [load_tool(n).schema() for n in names]


def end_of_turn(tokenizer: Any) -> int | None:
    """The token that ends an assistant turn: the chat template's (`<|im_end|>`, `<|eot_id|>`,
    `<|end|>`) when the vocabulary has one, else the tokenizer's end of sequence."""
    vocab = tokenizer.get_vocab()
    for token in ("<|im_end|>", "<|eot_id|>", "<|end|>"):
        if token in vocab:
            return int(vocab[token])
    return tokenizer.eos_token_id


def encode_completion(tokenizer: Any, prompt: str, completion: Sequence[dict[str, Any]], *, tools: Sequence[Any] = (),
                      max_length: int | None = None) -> tuple[list[int], list[int]]:
    """(input ids, mask) of a prompt-completion example: the prompt's tokens (context), then each
    assistant message's tokens and its end of turn (learned: after a tool call too, as a rollout's
    segment that ends with the model's end-of-turn token is learned in GRPO; after the last message
    as TRL appends the end-of-sequence token to a completion) with, between them, each tool result
    framed as the turn framed it when the agent called the tool (`training.tool_turns.result_ids`:
    context).

    The prompt and each piece are tokenized on their own, as the rollout tokenized the prompt and
    the model generated after it; so the tokens are the rollout's, up to how the model's decoded text
    tokenizes again. `tools` are the agent's `agents.tools.Tool`s (they frame the results)."""
    ids = list(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    mask = [0] * len(ids)
    supported = tool_turns.tool_support(tokenizer)
    end = end_of_turn(tokenizer)
    ended: tuple[int, ...] = () if end is None else (int(end),)
    last_text = ""
    for i, m in enumerate(completion):
        if m["role"] == "assistant":
            last_text = m["content"]
            piece = list(tokenizer(last_text, add_special_tokens=False)["input_ids"])
            if i == len(completion) - 1 or completion[i + 1]["role"] != "assistant":
                piece += ended  # the message's end of turn, learned
            ids += piece
            mask += [1] * len(piece)
        else:
            call = ToolCall(m.get("name") or "tool", {}, result=m["content"])
            written = tuple(tokenizer(last_text, add_special_tokens=False)["input_ids"]) + ended
            segment = Generation(token_ids=written, text=last_text, truncated=False)
            frame = tool_turns.result_ids(tokenizer, [{"role": "user", "content": "."}], list(tools), segment, call,
                                          supported=supported, end_ids=ended)  # the end of turn written above is not repeated
            ids += frame
            mask += [0] * len(frame)
    if max_length is not None:
        ids, mask = ids[:max_length], mask[:max_length]
    return ids, mask


def examples_for(config: RunConfig, conversations: dict[str, list[Conversation]], policy: Policy) -> list[Example]:
    """The policy's agents' examples, agent by agent, in file order."""
    out = []
    template = masking_template(policy.tokenizer)
    for agent in policy.agents:
        tools = agent_tools(config, agent, policy.tokenizer)
        for conv in conversations.get(agent, []):
            try:
                if conv.prompt is not None:
                    ids, mask = encode_completion(policy.tokenizer, conv.prompt, conv.messages,
                                                  tools=[load_tool(n) for n in config.agent(agent).tools], max_length=config.sft.max_length)
                else:
                    ids, mask = encode(policy.tokenizer, conv.messages, tools=tools, max_length=config.sft.max_length, template=template)
            except ValueError as exc:
                raise ValueError(f"{config.sft.path} line {conv.line}: {exc}") from None
            if sum(mask):
                out.append(Example(agent, tuple(ids), tuple(mask), conv.line))
    return out


# == the loss ======================================================================================


def collate(examples: Sequence[Example], pad: int) -> dict[str, torch.Tensor]:
    """Right-padded rows (as TRL's collator): input ids, attention mask, loss mask, all (B, T)."""
    width = max(len(e.input_ids) for e in examples)
    ids = torch.full((len(examples), width), pad, dtype=torch.long)  # (B, T)
    attn = torch.zeros_like(ids)  # (B, T)
    mask = torch.zeros_like(ids)  # (B, T)
    for i, e in enumerate(examples):
        n = len(e.input_ids)
        ids[i, :n] = torch.tensor(e.input_ids)
        attn[i, :n] = 1
        mask[i, :n] = torch.tensor(e.loss_mask)
    return {"input_ids": ids, "attention_mask": attn, "loss_mask": mask}


def micro_batches(examples: Sequence[Example], size: int, budget: int) -> list[list[Example]]:
    """The batch in order, cut into micro-batches of at most `size` rows and `budget` padded tokens
    (rows x the longest row), as the GRPO update's (`optim.micro_batch_tokens` bounds the memory of
    the logits, rows x length x vocabulary); a row longer than the budget has one to itself."""
    out: list[list[Example]] = []
    width = 0
    for e in examples:
        n = len(e.input_ids)
        if out and len(out[-1]) < size and (len(out[-1]) + 1) * max(width, n) <= budget:
            out[-1].append(e)
            width = max(width, n)
        else:
            out.append([e])
            width = n
    return out


def token_nll(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per predicted token: its negative log-likelihood, whether it was the model's top-1 guess, and
    whether it counts (the assistant mask shifted onto the position that predicts it); each (B, T-1)."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False).logits  # (B, T, V)
    logits = logits[:, :-1].float()  # (B, T-1, V) position t predicts token t+1
    target = batch["input_ids"][:, 1:]  # (B, T-1)
    # over flat (N, V) rows, as TRL's loss does: the (B, V, T) form reduces over a strided vocabulary
    # and lost about 15x the precision on a real one
    nll = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), reduction="none")  # (B*(T-1),)
    nll = nll.view(target.shape)  # (B, T-1)
    hit = logits.argmax(-1) == target  # (B, T-1)
    counted = batch["loss_mask"][:, 1:].bool() & batch["attention_mask"][:, 1:].bool()  # (B, T-1)
    return nll, hit, counted


def sft_loss(nll: torch.Tensor, counted: torch.Tensor, n_tokens: int) -> torch.Tensor:
    """sum of the counted tokens' NLL / `n_tokens` (the counted tokens of the whole batch, so
    micro-batches add up to the batch's token mean). nll, counted: (B, T-1)."""
    return (nll * counted).sum() / max(n_tokens, 1)


def update_policy(policy: Policy, batch: list[Example], cfg: RunConfig, step: int) -> dict[str, dict[str, float]]:
    """One optimizer step of SFT on `batch`; per agent: loss, token_accuracy, tokens, examples
    (and the policy's grad_norm and lr)."""

    assert policy.optimizer is not None
    lr = step_lr(cfg, step)
    for group in policy.optimizer.param_groups:
        group["lr"] = lr
    device = next(policy.model.parameters()).device
    pad = policy.tokenizer.pad_token_id or 0
    n_tokens = sum(sum(e.loss_mask[1:]) for e in batch)  # the first token is never predicted
    sums: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    with policy.active() as model:
        model.train()
        policy.optimizer.zero_grad(set_to_none=True)
        for micro in micro_batches(batch, cfg.optim.micro_batch_size, cfg.optim.micro_batch_tokens):
            b = {k: v.to(device) for k, v in collate(micro, pad).items()}
            nll, hit, counted = token_nll(model, b)  # (B, T-1) each
            sft_loss(nll, counted, n_tokens).backward()
            for i, e in enumerate(micro):
                s = sums[e.agent]
                s["nll"] += float((nll[i].detach() * counted[i]).sum())
                s["hits"] += float((hit[i] & counted[i]).sum())
                s["tokens"] += float(counted[i].sum())
                s["examples"] += 1
        grad_norm = float(torch.nn.utils.clip_grad_norm_(policy.params, cfg.optim.max_grad_norm))
        policy.optimizer.step()
        model.eval()
    return {
        agent: {
            "loss": s["nll"] / max(s["tokens"], 1.0),
            "token_accuracy": s["hits"] / max(s["tokens"], 1.0),
            "tokens": s["tokens"],
            "examples": s["examples"],
            "grad_norm": grad_norm,
            "lr": lr,
        }
        for agent, s in sums.items()
    }


# == the run =======================================================================================


def train_sft(config: RunConfig, *, out_dir: str | Path, sink: EventSink, plan: Plan | None = None) -> TrainResult:
    """A whole SFT run, in one process (`training.rank.run_loop` hands `algorithm: sft` configs here)."""
    config.validate()
    (plan or Plan.resolve(config)).report(sink)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(config.to_yaml(), encoding="utf-8")
    seed_everything(config.seed)

    assert config.sft.path
    per_agent = by_agent(read_conversations(config.sft.path), config)
    env = load_environment(config.topology.environment, **config.topology.env_args)
    _, eval_tasks = load_tasks(config, env) if config.eval.every else ([], [])
    has_eval = bool(config.eval.every and eval_tasks)
    progress = RunProgress(sink, config, has_eval=has_eval)
    progress.loading(f"{config.model.source} ({config.topology.specialization} policies)")
    policies = build_policies(config)
    generator = torch.Generator().manual_seed(config.seed + 1)
    warm = init_from(config, policies)
    if warm is not None:
        sink.log(f"started from {warm.checkpoint} (step {warm.step}): {', '.join(f'{a} <- {b}' for a, b in warm.loaded.items())}")
    examples = {p.name: examples_for(config, per_agent, p) for p in policies.trainable()}
    for agent, convs in per_agent.items():
        sink.log(f"agent {agent}: {len(convs)} conversations" + ("" if config.agent(agent).trainable else " (not trainable: left out)"))
    if not any(examples.values()):
        raise ValueError(f"{config.sft.path}: no trainable agent has a conversation with assistant tokens to learn from")

    start_step = 0
    if config.checkpoint.resume_from:
        check_resume(config)
        start_step = restore(Path(config.checkpoint.resume_from), policies, generator)
        sink.log(f"resumed from {config.checkpoint.resume_from} at step {start_step}")
    sampler = Sampler(env, policies, config, generator)
    total = config.optim.steps
    result = TrainResult(status="succeeded", step=start_step, start_step=start_step)

    def run_eval(at: int) -> None:
        result.evaluations.extend(evaluate(sampler, eval_tasks, step=at, sink=sink,
                                           on_progress=lambda share, done, n: progress.evaluating(at, done, n, share)))

    try:
        with reporting(config, out, sink, main=True) as run_sink:
            sink = run_sink
            sink.run_started(total_steps=total, start_step=start_step)
            if start_step == 0 and has_eval:
                run_eval(0)
            step = start_step
            while step < total:
                if sink.should_stop():
                    result.status = "cancelled"
                    progress.stopping(step)
                    break
                step += 1
                progress.training(step)
                t0 = time.perf_counter()
                agents: dict[str, dict[str, float]] = {}
                for policy in policies.trainable():
                    mine = examples[policy.name]
                    if mine:
                        batch = [mine[i] for i in batch_indices(len(mine), config.sft.batch_size, step, config.seed)]
                        agents.update(update_policy(policy, batch, config, step))
                tokens = sum(a["tokens"] for a in agents.values())
                values = {
                    "loss": sum(a["loss"] * a["tokens"] for a in agents.values()) / max(tokens, 1.0),
                    "token_accuracy": sum(a["token_accuracy"] * a["tokens"] for a in agents.values()) / max(tokens, 1.0),
                    "tokens": tokens,
                    "step_time": time.perf_counter() - t0,
                }
                progress.trained()
                sink.metrics(StepMetrics(step=step, total_steps=total, values=values, agents=agents))
                result.final_metrics = values
                if has_eval and step % config.eval.every == 0 and step < total:
                    run_eval(step)
                if config.checkpoint.every and step % config.checkpoint.every == 0 and step < total:
                    progress.checkpointing(step)
                    save_checkpoint(out, step, policies, generator, config, sink)
                    progress.checkpointed()
            if result.status == "succeeded" and has_eval:
                run_eval(step)
            progress.checkpointing(step)
            result.step, result.checkpoint = step, save_checkpoint(out, step, policies, generator, config, sink)
            progress.checkpointed()
            return result
    finally:
        sampler.pool.shutdown()
