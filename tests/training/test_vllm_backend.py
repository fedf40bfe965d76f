"""The vLLM backend: backend selection and the pure helpers run on CPU; the engine tests need
vLLM and CUDA (marked gpu) and skip cleanly without them."""

from __future__ import annotations

import logging
import re
import sys
from types import ModuleType, SimpleNamespace

import pytest
import torch

from training import plan, vllm_backend
from training.config import RunConfig
from training.generation import Generation

TINY = {
    "name": "t",
    "model": {"source": "tiny-random:llama"},
    "topology": {
        "environment": "math_tool",
        "specialization": "lora",
        "agents": [{"name": "tool", "role": "tool"}, {"name": "reasoner", "role": "reasoner"}],
    },
}


def config(**overrides) -> RunConfig:
    return RunConfig.from_dict(TINY).replace(**overrides)


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TROUPE_DATA_DIR", str(tmp_path))
    return tmp_path


# -- backend selection (CPU) ----------------------------------------------------------------------


def test_it_imports_without_vllm():
    assert callable(plan.resolve_backend) and callable(vllm_backend.VLLMGenerator)


def test_it_keeps_hf_when_hf_is_requested(monkeypatch):
    monkeypatch.setattr(plan, "vllm_unavailable_reason", lambda cfg: None)
    assert plan.resolve_backend(config(**{"generation.backend": "hf"}))[0] == "hf"


def test_auto_picks_hf_without_vllm_or_cuda(monkeypatch, caplog):
    monkeypatch.setattr(plan, "vllm_unavailable_reason", lambda cfg: "vLLM is not installed")
    with caplog.at_level(logging.WARNING, logger="training.plan"):
        assert plan.resolve_backend(config(**{"generation.backend": "auto"}))[0] == "hf"
    assert not caplog.records  # auto falling back is expected, not a warning


def test_auto_picks_vllm_when_it_can_serve_the_run(monkeypatch):
    monkeypatch.setattr(plan, "vllm_unavailable_reason", lambda cfg: None)
    assert plan.resolve_backend(config(**{"generation.backend": "auto"}))[0] == "vllm"


def test_requested_vllm_falls_back_to_hf_with_a_warning(monkeypatch, caplog):
    monkeypatch.setattr(plan, "vllm_unavailable_reason", lambda cfg: "vLLM is not installed")
    with caplog.at_level(logging.WARNING, logger="training.plan"):
        assert plan.resolve_backend(config(**{"generation.backend": "vllm"}))[0] == "hf"
    assert "falling back to the HF backend" in caplog.text
    assert "vLLM is not installed" in caplog.text


@pytest.mark.skipif(plan.vllm_available(), reason="this machine has vLLM and CUDA")
def test_this_machine_without_vllm_or_cuda_resolves_to_hf(caplog):
    assert plan.vllm_available() is False
    with caplog.at_level(logging.WARNING, logger="training.plan"):
        assert plan.resolve_backend(config(**{"generation.backend": "vllm"}))[0] == "hf"
    assert "falling back" in caplog.text


def test_full_topology_with_different_base_models_cannot_use_one_engine(monkeypatch):
    monkeypatch.setattr(plan, "vllm_available", lambda: True)
    monkeypatch.setattr(plan, "vllm_installed", lambda: True)
    cfg = config(
        **{
            "topology.specialization": "full",
            "topology.agents": [
                {"name": "tool", "role": "tool", "model": "tiny-random:llama"},
                {"name": "reasoner", "role": "reasoner", "model": "bundled:smollm2-135m-instruct"},
            ],
        }
    )
    assert "different base models" in (plan.vllm_unavailable_reason(cfg) or "")
    assert plan.vllm_unavailable_reason(config()) is None


@pytest.mark.skipif(plan.vllm_installed(), reason="vLLM is installed")
def test_building_a_generator_without_vllm_says_what_to_do():
    with pytest.raises(RuntimeError, match="generation.backend: hf"):
        vllm_backend.VLLMGenerator(config(), policies=None)  # type: ignore[arg-type]


# -- pure helpers (CPU) ---------------------------------------------------------------------------


def test_it_rounds_the_lora_rank_up_to_one_vllm_accepts():
    assert vllm_backend.lora_rank_for_vllm(4) == 8
    assert vllm_backend.lora_rank_for_vllm(16) == 16
    assert vllm_backend.lora_rank_for_vllm(17) == 32
    with pytest.raises(ValueError, match="lora.r"):
        vllm_backend.lora_rank_for_vllm(1024)


def test_auto_dtype_is_bfloat16_like_the_hf_loader_on_gpu():
    assert vllm_backend.vllm_dtype("auto") == "bfloat16"
    assert vllm_backend.vllm_dtype("float16") == "float16"


def test_it_turns_vllm_outputs_into_generations_in_sample_order():
    from training.models import load_tokenizer

    tok = load_tokenizer("tiny-random:llama")
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    hi = tok("hi", add_special_tokens=False)["input_ids"]
    outputs = [
        SimpleNamespace(
            outputs=[
                SimpleNamespace(index=1, token_ids=hi, finish_reason="length"),
                SimpleNamespace(index=0, token_ids=[*hi, im_end], finish_reason="stop"),
            ]
        )
    ]
    (group,) = vllm_backend.to_generations(outputs, tok)
    assert group == [
        Generation(token_ids=(*hi, im_end), text="hi", truncated=False),
        Generation(token_ids=tuple(hi), text="hi", truncated=True),
    ]


def completion(index: int, ids: list[int], finish_reason: str) -> SimpleNamespace:
    return SimpleNamespace(index=index, token_ids=ids, finish_reason=finish_reason)


def test_the_stop_pattern_cuts_a_completion_where_the_hf_backend_would_have_stopped():
    from training.models import load_tokenizer

    tok = load_tokenizer("tiny-random:llama")
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    ids = tok("Answer: 42\nand then some more words", add_special_tokens=False)["input_ids"]
    stop = re.compile(r"Answer:[ \t]*\d+[ \t]*\n")
    kept = vllm_backend.cut_at_stop(tuple(ids), tok, stop, every=4)
    assert kept is not None and len(kept) % 4 == 0 and len(kept) < len(ids)
    # the HF backend's rule: the first prefix of a multiple of 4 tokens whose text matches
    first = next(n for n in range(4, len(ids) + 1, 4) if stop.search(tok.decode(ids[:n], skip_special_tokens=True)))
    assert kept == tuple(ids[:first])
    assert vllm_backend.cut_at_stop(tuple(ids), tok, re.compile("never there"), every=4) is None

    outputs = [SimpleNamespace(outputs=[completion(0, ids, "length"), completion(1, [*ids[:3], im_end], "stop")])]
    (group,) = vllm_backend.to_generations(outputs, tok, stop=stop)
    assert group[0].token_ids == kept and group[0].truncated is False  # ended by the pattern
    assert group[1].token_ids == (*ids[:3], im_end)  # no match: kept whole
    (plain,) = vllm_backend.to_generations(outputs, tok)
    assert plain[0].token_ids == tuple(ids) and plain[0].truncated is True


def test_a_pattern_completed_in_the_last_tokens_keeps_them_all_and_is_not_truncated():
    from training.models import load_tokenizer

    tok = load_tokenizer("tiny-random:llama")
    ids = tok("x Answer: 7\n", add_special_tokens=False)["input_ids"]
    stop = re.compile(r"Answer:[ \t]*\d+[ \t]*\n")
    # no check point falls inside the completion: the HF backend ran to max_new_tokens, then saw the match
    outputs = [SimpleNamespace(outputs=[completion(0, ids, "length")])]
    (group,) = vllm_backend.to_generations(outputs, tok, stop=stop, stop_check_every=len(ids) + 1)
    assert group == [Generation(token_ids=tuple(ids), text=tok.decode(ids, skip_special_tokens=True), truncated=False)]


@pytest.fixture
def fake_vllm(monkeypatch):
    """Just enough of vllm's import surface for `VLLMGenerator.generate` to run on CPU."""
    seen: list = []
    vllm = ModuleType("vllm")
    vllm.SamplingParams = lambda **kw: SimpleNamespace(**kw)  # type: ignore[attr-defined]
    inputs = ModuleType("vllm.inputs")
    inputs.TokensPrompt = dict  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.inputs", inputs)

    def generate(prompts, params, **kw):
        seen.append(params)
        return [SimpleNamespace(outputs=[completion(j, [10 + b, 20 + j], "length") for j in range(p.n)]) for b, p in enumerate(params)]

    gen = vllm_backend.VLLMGenerator.__new__(vllm_backend.VLLMGenerator)
    gen.llm = SimpleNamespace(generate=generate)
    gen.asleep = False
    monkeypatch.setattr(gen, "_sync", lambda policy: None)
    from training.models import load_tokenizer

    policy = SimpleNamespace(
        model=SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=None)), tokenizer=load_tokenizer("tiny-random:llama")
    )
    return gen, policy, seen


def test_greedy_sampling_asks_vllm_for_one_completion_and_repeats_it(fake_vllm):
    gen, policy, seen = fake_vllm
    groups = gen.generate(policy, [[1, 2], [3]], n=3, max_new_tokens=2, temperature=0.0)
    assert [p.n for p in seen[-1]] == [1, 1]  # vLLM refuses n > 1 at temperature 0
    assert [len(g) for g in groups] == [3, 3]
    assert all(g == group[0] for group in groups for g in group)


def test_sampling_seeds_each_prompt_past_the_previous_prompts_samples(fake_vllm):
    gen, policy, seen = fake_vllm
    stats = vllm_backend.GenerationStats()
    groups = gen.generate(policy, [[1, 2], [3]], n=3, max_new_tokens=2, temperature=1.0, seed=100, stats=stats)
    assert [(p.n, p.seed) for p in seen[-1]] == [(3, 100), (3, 103)]  # vLLM adds the sample index
    assert [[g.token_ids for g in group] for group in groups] == [[(10, 20), (10, 21), (10, 22)], [(11, 20), (11, 21), (11, 22)]]
    assert stats.tokens == 12


def test_it_saves_one_agents_adapter_where_vllm_can_load_it(data_dir):
    from training.policies import build_policies

    policies = build_policies(config(), device=torch.device("cpu"))
    tool = policies.policies["tool"]
    folder = vllm_backend.save_adapter(tool, data_dir / "tool-1")
    assert (folder / "adapter_config.json").is_file()
    assert (folder / "adapter_model.safetensors").is_file()
    from safetensors.torch import load_file

    keys = list(load_file(str(folder / "adapter_model.safetensors")))
    assert keys and all("lora_" in k for k in keys)
    assert not any(".reasoner." in k for k in keys)  # only this agent's adapter


# -- the real engine (GPU) ------------------------------------------------------------------------

BUNDLED = "bundled:smollm2-135m-instruct"


def gpu_generator(specialization: str, agents: list[dict]):
    pytest.importorskip("vllm")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from training.policies import build_policies

    cfg = RunConfig.from_dict(
        {
            **TINY,
            "model": {"source": BUNDLED},
            "topology": {"environment": "math_tool", "specialization": specialization, "agents": agents},
            "generation": {"backend": "vllm", "vllm_gpu_memory_utilization": 0.3},
        }
    )
    policies = build_policies(cfg)
    return vllm_backend.VLLMGenerator(cfg, policies, engine_kwargs={"enforce_eager": True}), policies


def prompt_ids(policies, text: str) -> list[int]:
    tok = next(iter(policies.policies.values())).tokenizer
    chat = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)
    return tok(chat, add_special_tokens=False)["input_ids"]


def greedy(gen, policy, prompts) -> list[tuple[int, ...]]:
    groups = gen.generate(policy, prompts, n=1, max_new_tokens=16, temperature=0.0)
    return [group[0].token_ids for group in groups]


@pytest.mark.gpu
@pytest.mark.slow
def test_it_samples_n_completions_per_prompt_with_the_bundled_model(data_dir):
    gen, policies = gpu_generator("single", [{"name": "solver", "role": "reasoner"}])
    try:
        policy = policies.policies["shared"]
        prompts = [prompt_ids(policies, "What is 2 + 3?"), prompt_ids(policies, "Name a colour.")]
        groups = gen.generate(policy, prompts, n=3, max_new_tokens=24, temperature=1.0, top_p=1.0, seed=7)
        assert [len(g) for g in groups] == [3, 3]
        stops = set(vllm_backend.stop_token_ids(policy.model, policy.tokenizer))
        for g in (g for group in groups for g in group):
            assert 0 < len(g.token_ids) <= 24
            assert g.truncated or g.token_ids[-1] in stops  # the stop token is kept, as in the HF backend
        again = gen.generate(policy, prompts, n=3, max_new_tokens=24, temperature=1.0, top_p=1.0, seed=7)
        assert again == groups  # seeded
        gen.sleep()
        assert gen.generate(policy, prompts, n=3, max_new_tokens=24, temperature=1.0, top_p=1.0, seed=7) == groups
    finally:
        gen.close()


@pytest.mark.gpu
@pytest.mark.slow
def test_a_new_lora_request_after_an_adapter_update_changes_only_that_agents_outputs(data_dir):
    agents = [{"name": "tool", "role": "tool"}, {"name": "reasoner", "role": "reasoner"}]
    gen, policies = gpu_generator("lora", agents)
    try:
        tool, reasoner = policies.policies["tool"], policies.policies["reasoner"]
        prompts = [prompt_ids(policies, "Write a Python expression for 12 * 7.")]
        before_tool, before_reasoner = greedy(gen, tool, prompts), greedy(gen, reasoner, prompts)
        assert before_tool == before_reasoner  # fresh adapters (B = 0) are the base model
        first_id = gen._lora_requests["tool"].lora_int_id
        with torch.no_grad():  # stands in for an optimizer step on the tool adapter only
            for name, p in tool.model.named_parameters():
                if "lora_B" in name and name.endswith(".tool.weight"):
                    p.add_(torch.randn_like(p) * 0.5)
        gen.weights_changed(tool)
        assert greedy(gen, tool, prompts) != before_tool
        assert gen._lora_requests["tool"].lora_int_id != first_id
        assert greedy(gen, reasoner, prompts) == before_reasoner
    finally:
        gen.close()


@pytest.mark.gpu
@pytest.mark.slow
def test_full_weights_are_pushed_after_an_update_and_survive_sleep(data_dir):
    gen, policies = gpu_generator("prompt", [{"name": "a", "role": "tool"}, {"name": "b", "role": "reasoner"}])
    try:
        policy = policies.policies["shared"]
        prompts = [prompt_ids(policies, "What is 2 + 3?")]
        before = greedy(gen, policy, prompts)
        with torch.no_grad():
            for p in policy.model.parameters():
                p.add_(torch.randn_like(p) * 0.05)
        gen.weights_changed(policy)
        after = greedy(gen, policy, prompts)
        assert after != before
        gen.sleep()
        assert greedy(gen, policy, prompts) == after
    finally:
        gen.close()
