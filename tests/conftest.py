"""Suite-wide settings: offline, quiet libraries, one BLAS thread per test process
(the CI machine has 2 cores; oversubscription made model tests 4x slower)."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

torch.set_num_threads(1)


import importlib.util  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.fixture(scope="session")
def example_script():
    """Load a script under examples/ as a module: example_script("hacking/table.py")."""

    def load(relative: str):
        spec = importlib.util.spec_from_file_location("example_" + relative.replace("/", "_")[:-3],
                                                      EXAMPLES / relative)  # fmt: skip
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load


@pytest.fixture(scope="session")
def trained_lora():
    """policy -> the policy with LoRA (r 4) on every linear layer and random, non-zero
    B matrices, so that the adapters change its output."""
    from ponder.config import LoraConfig
    from ponder.models import apply_lora

    def wrap(policy):
        policy = apply_lora(policy, LoraConfig(r=4, alpha=8))
        generator = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for name, param in policy.model.named_parameters():
                if "lora_B" in name:
                    param.copy_(torch.randn(param.shape, generator=generator) * 0.1)
        return policy

    return wrap
