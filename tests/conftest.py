"""Suite-wide settings: offline, quiet libraries, one BLAS thread per test process
(the CI machine has 2 cores; oversubscription made model tests 4x slower)."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

torch.set_num_threads(1)


import pytest  # noqa: E402


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
