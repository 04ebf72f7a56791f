"""A scalar value head on the policy's last hidden state, for PPO with GAE."""

from __future__ import annotations


import torch


class ValueHead(torch.nn.Module):
    """V(s_t) = w · h_t + b, initialised to zero so early advantages are plain returns."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(hidden_size, 1)
        torch.nn.init.zeros_(self.linear.weight)
        torch.nn.init.zeros_(self.linear.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.linear(hidden.float()).squeeze(-1)
