"""`training.export.export_gguf` and `python -m training export --gguf`: an agent's LoRA adapter
merged into its base and written by llama.cpp's converter as one GGUF file (f16, q8_0) with an Ollama
Modelfile; llama.cpp (llama-cpp-python) loading that file generates greedily the same tokens as the
merged model in transformers. Agents that cannot be exported are refused and leave nothing behind."""

from __future__ import annotations

import json

import pytest
import torch

from tests.training.conftest import TINY_LORA
from training.__main__ import main
from training.config import RunConfig
from training.export import GGUF_TYPES, export_gguf, gguf_architecture

PROMPTS = ["The capital of France is", "def add(a, b):\n    return", "Once upon a time, there was a", "2 + 3 ="]
NEW_TOKENS = 12


@pytest.fixture(scope="module")
def bundled_lora(bundled_models, tmp_path_factory):
    """(config, checkpoint folder) of configs/tiny-lora.yaml on the bundled SmolLM2-135M: the
    agents' LoRA adapters as `save_policies` writes them, moved off their zero init."""
    from training.policies import build_policies, save_policies

    mp = pytest.MonkeyPatch()
    mp.setenv("TROUPE_DATA_DIR", str(bundled_models.parent))
    config = RunConfig.load(TINY_LORA).replace(**{"model.source": "bundled:smollm2-135m-instruct"})
    policies = build_policies(config, device=torch.device("cpu"))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for policy in policies.policies.values():
            for p in policy.params:
                p.add_(torch.randn(p.shape, generator=gen) * 0.02)
    folder = tmp_path_factory.mktemp("bundled-checkpoint") / "step-000001"
    save_policies(policies, folder)
    del policies
    yield config, folder
    mp.undo()


@pytest.fixture(scope="module")
def transformers_greedy(bundled_lora):
    """For each prompt of PROMPTS: (its token ids, the greedy continuation of the adapter merged into
    the base in transformers, whether the base alone continues differently). Each GGUF type's file
    is compared with these; they do not depend on the type, so they are computed once."""
    from peft import PeftModel

    from training.models import load_model

    _, checkpoint = bundled_lora
    base, tokenizer = load_model("bundled:smollm2-135m-instruct", dtype="float32", device="cpu")
    ids = {prompt: tokenizer(prompt, add_special_tokens=False)["input_ids"] for prompt in PROMPTS}
    untrained = {prompt: _greedy_transformers(base.eval(), ids[prompt]) for prompt in PROMPTS}  # before the merge changes `base`
    merged = PeftModel.from_pretrained(base, str(checkpoint / "tool")).merge_and_unload().eval()
    greedy = {}
    for prompt in PROMPTS:
        expected = _greedy_transformers(merged, ids[prompt])
        greedy[prompt] = ids[prompt], expected, untrained[prompt] != expected
    return greedy


def _greedy_transformers(model, ids: list[int]) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             do_sample=False, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS)
    return out[0, len(ids):].tolist()


def _greedy_llama_cpp(llm, ids: list[int]) -> list[int]:
    llm.reset()
    tokens = []
    for token in llm.generate(ids, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0, reset=True):
        tokens.append(token)
        if len(tokens) == NEW_TOKENS:
            break
    return tokens


@pytest.mark.slow
@pytest.mark.parametrize("gguf_type", GGUF_TYPES)
def test_llama_cpp_generates_what_the_merged_model_generates(bundled_lora, transformers_greedy, tmp_path, gguf_type):
    llama_cpp = pytest.importorskip("llama_cpp", reason="needs llama-cpp-python (requirements-llamacpp.txt) to load the GGUF file")

    config, checkpoint = bundled_lora
    export = export_gguf(config, agent="tool", adapter=checkpoint / "tool", out=tmp_path / "gguf", gguf_type=gguf_type,
                         about={"run": 3})
    assert export.files == ["Modelfile", f"tool-{gguf_type}.gguf", "troupe.json"] and export.architecture == "LlamaForCausalLM"
    assert json.loads((export.folder / "troupe.json").read_text()) == {
        "run": 3, "agent": "tool", "base_model": "bundled:smollm2-135m-instruct", "format": "gguf", "gguf_type": gguf_type,
        "architecture": "LlamaForCausalLM", "file": f"tool-{gguf_type}.gguf"}
    modelfile = (export.folder / "Modelfile").read_text()
    assert f"\nFROM ./tool-{gguf_type}.gguf\n" in modelfile and 'PARAMETER stop "<|im_end|>"' in modelfile

    if gguf_type == "q8_0" and "AMX_INT8 = 1" in llama_cpp.llama_print_system_info().decode():
        # llama-cpp-python 0.3.36 compiled natively on a host with AMX int8 (a Sapphire Rapids Xeon, its
        # build reporting AMX_INT8 = 1) segfaults in `llm.eval` on this q8_0 file, every time; the f16 file
        # decodes exactly, and hosts without AMX decoded both. A crash would take the test's worker down
        # with it, so this one check is not made there: the q8_0 file is written and described above.
        pytest.skip("this host's llama.cpp build (AMX_INT8) segfaults decoding q8_0; the f16 file is checked")
    # One thread, for one token and for a batch: each of llama.cpp's threads computes whole rows, so
    # the numbers are the same with more, but its threads spin at every operation's barrier, and on
    # a busy machine (the suite's other worker) two of them can wait on each other for seconds a token.
    llm = llama_cpp.Llama(model_path=str(export.file), n_ctx=256, n_threads=1, n_threads_batch=1, seed=0, logits_all=True,
                          verbose=False)
    differs_from_base, agree, positions = False, 0, 0
    for prompt in PROMPTS:
        ids, expected, differs = transformers_greedy[prompt]
        assert llm.tokenize(prompt.encode(), add_bos=False, special=False) == ids, prompt  # the vocabulary came across
        differs_from_base |= differs
        if gguf_type == "f16":
            assert _greedy_llama_cpp(llm, ids) == expected, prompt
        # Teacher-forced: llama.cpp's most likely next token at each position of transformers' greedy text.
        llm.reset()
        llm.eval(ids + expected)
        predicted = llm.scores[len(ids) - 1:len(ids) + NEW_TOKENS - 1].argmax(axis=-1).tolist()
        assert predicted[0] == expected[0], prompt
        agree += sum(p == e for p, e in zip(predicted, expected, strict=True))
        positions += NEW_TOKENS
    # f16 generates exactly what transformers does; q8_0's 8-bit weights flip a near-tie now and then.
    assert agree / positions >= (1.0 if gguf_type == "f16" else 0.9), f"{agree}/{positions}"
    assert differs_from_base  # the adapter was merged in: some prompt continues differently from the base
    print(f"{gguf_type}: llama.cpp's next token agrees with transformers' greedy one at {agree}/{positions} positions")


def test_it_refuses_an_architecture_the_converter_does_not_know(lora_checkpoint, tmp_path):
    config, checkpoint = lora_checkpoint
    unknown = tmp_path / "unknown-model"
    unknown.mkdir()
    (unknown / "config.json").write_text(json.dumps({"architectures": ["NoSuchForCausalLM"], "model_type": "nosuch"}))
    with pytest.raises(ValueError, match="does not know the architecture NoSuchForCausalLM"):
        gguf_architecture(unknown)
    config = config.replace(**{"model.source": f"local:{unknown}"})
    with pytest.raises(ValueError, match="does not know the architecture NoSuchForCausalLM"):
        export_gguf(config, agent="tool", adapter=checkpoint / "tool", out=tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["unknown-model"]  # nothing merged, nothing written


def test_it_refuses_an_agent_without_an_adapter_and_an_unknown_type(lora_checkpoint, tmp_path):
    config, checkpoint = lora_checkpoint
    with pytest.raises(FileNotFoundError, match="not a LoRA adapter folder"):
        export_gguf(config, agent="tool", adapter=tmp_path, out=tmp_path / "out")
    with pytest.raises(ValueError, match="unknown GGUF type 'q4_k'; allowed: f16, q8_0"):
        export_gguf(config, agent="tool", adapter=checkpoint / "tool", out=tmp_path / "out", gguf_type="q4_k")
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.tmp").exists()


def test_a_model_the_converter_cannot_finish_leaves_no_half_written_file(lora_checkpoint, tmp_path):
    """tiny-random:llama is a LlamaForCausalLM whose tokenizer llama.cpp does not know: the
    converter stops after the merge, and the earlier export stays as it was."""
    config, checkpoint = lora_checkpoint
    previous = tmp_path / "out"
    previous.mkdir()
    (previous / "tool-q8_0.gguf").write_bytes(b"GGUF an earlier export")
    with pytest.raises(ValueError, match="GGUF converter cannot convert this LlamaForCausalLM model: BPE pre-tokenizer was not recognized"):
        export_gguf(config, agent="tool", adapter=checkpoint / "tool", out=previous)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert sorted(p.name for p in previous.iterdir()) == ["tool-q8_0.gguf"]
    assert (previous / "tool-q8_0.gguf").read_bytes() == b"GGUF an earlier export"


def test_the_cli_refuses_what_it_cannot_export(lora_checkpoint, tmp_path, capsys):
    _, checkpoint = lora_checkpoint
    out = tmp_path / "tool-gguf"
    assert main(["export", str(TINY_LORA), "--checkpoint", str(checkpoint), "--agent", "critic", "--out", str(out), "--gguf", "q8_0"]) == 2
    assert "no agent 'critic'" in capsys.readouterr().err and not out.exists()
