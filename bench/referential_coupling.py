"""Why the referential game's speaker does not separate its targets: how far one update for one
target moves the other target's policy (docs/benchmarks.md, "Referential game").

From the format warm start's speaker adapter, one Adam step (the runs' learning rate) raises the
log-probability of code word `c` for the target red, as a GRPO step with a positive advantage on
that one sample would. Printed: P(code | target) for both targets before and after, and the
coupling, Δ log P(c | blue) / Δ log P(c | red): 1 means the update cannot tell the targets apart
(a protocol would need it near 0 or below). The same for the listener: raising `red` after code
word 1, measured after code word 2.

    .venv/bin/python bench/referential_coupling.py runs/referential-format/checkpoints/step-000010
    .venv/bin/python bench/referential_coupling.py runs/referential-format-prompt/checkpoints/step-000010 \
        --config configs/referential-format-prompt.yaml --lr 2e-5     # the `prompt` arm's shared model
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agents.envs.referential import OBJECTS, Referential  # noqa: E402
from training.config import RunConfig  # noqa: E402
from training.policies import build_policies  # noqa: E402
from training.warmstart import init_from  # noqa: E402


def prompt_ids(tokenizer, instructions: str, observation: str) -> list[int]:
    messages = [{"role": "system", "content": instructions}, {"role": "user", "content": observation}]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]


def answer_logprob(model, tokenizer, prompt: list[int], answer: str) -> torch.Tensor:
    """log P(answer then end of turn | prompt), summed over the answer's tokens."""
    ids = tokenizer(answer + "<|im_end|>", add_special_tokens=False)["input_ids"]
    x = torch.tensor([prompt + ids])
    logits = model(input_ids=x).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids)[:, None]).sum()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("checkpoint", help="the format warm start's checkpoint folder")
    parser.add_argument("--config", default="configs/referential-lora.yaml")
    parser.add_argument("--lr", type=float, default=None, help="default: the config's optim.lr")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    config = RunConfig.load(args.config).replace(**{"model.init_from.run": args.checkpoint})
    policies = build_policies(config)
    init_from(config, policies)
    env = Referential(**config.topology.env_args)
    lr = args.lr or config.optim.lr
    row = {"target": "red", "candidates": list(OBJECTS[: env.k])}  # red, blue, ...: the targets compared are the first two
    cases = {
        "speaker": (lambda target: env.observe(env.reset({**row, "target": target}, task_id="t", roles=env.roles), "speaker"),
                    "red", "blue", "1", env.codes),
        "listener": (lambda code: env.observe(_heard(env, row, code), "listener"), "1", "2", "red", tuple(row["candidates"])),
    }
    print(f"one Adam step at lr {lr:g} on one sample; coupling = Δ log P(answer | other) / Δ log P(answer | trained)")
    for agent, (observe, trained, other, answer, answers) in cases.items():
        policy = policies.for_agent(agent)
        model, tok = policy.model, policy.tokenizer
        with policy.active():
            params = [p for p in model.parameters() if p.requires_grad]
            instructions = env.default_instructions[agent]
            prompts = {key: prompt_ids(tok, instructions, observe(key)) for key in (trained, other)}

            def table(model=model, tok=tok, prompts=prompts, answers=answers) -> dict[str, dict[str, float]]:  # this agent's, bound
                with torch.no_grad():
                    return {key: {a: answer_logprob(model, tok, p, a).item() for a in answers} for key, p in prompts.items()}

            before = table()
            optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
            loss = -answer_logprob(model, tok, prompts[trained], answer)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            after = table()
        moved_trained = after[trained][answer] - before[trained][answer]
        moved_other = after[other][answer] - before[other][answer]
        show = lambda t: ", ".join(f"{a} {torch.tensor(v).exp().item():.2f}" for a, v in t.items())  # noqa: E731
        print(f"{agent}: raise {answer!r} for {trained!r}")
        for key in (trained, other):
            print(f"  {key!r}: before {show(before[key])}; after {show(after[key])}")
        print(f"  Δ log P: {moved_trained:+.3f} for {trained!r}, {moved_other:+.3f} for {other!r}: coupling {moved_other / moved_trained:.2f}")
    return 0


def _heard(env: Referential, row: dict, code: str):
    state = env.reset(row, task_id="t", roles=env.roles)
    return env.step(state, agent="speaker", role="speaker", action=code).state


if __name__ == "__main__":
    sys.exit(main())
