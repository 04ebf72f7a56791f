"""A Tinker-compatible training API (`ponder tinker-serve`): the service the published
`tinker` client talks to, on ponder's own parts.

Create a LoRA training client on the served base model, `forward_backward` with
Tinker's losses (cross_entropy, importance_sampling, ppo; serve/tinker/losses.py maps
them onto ponder's registered pure functions), `optim_step` (AdamW), sampling clients
(`save_weights_for_sampler`, `create_sampling_client`, `sample` on ponder's `hf`
backend with the sampled tokens' log-probs), `save_state` / `load_state`: the
cookbook's SFT and RL loops run against it unchanged but for the base model's name.

Modules: wire (the client's protobuf messages), losses, training (one training
client's model), sampling (sampling sessions and their decoders), checkpoints
(tinker:// paths on disk), futures (the worker and its futures), service (state and
request checks), routes (HTTP), server (uvicorn). Needs the `tinker` extra.
"""

from ponder.serve.tinker.service import TinkerConfig, TinkerService

__all__ = ["TinkerConfig", "TinkerService"]
