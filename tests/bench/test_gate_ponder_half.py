"""The correctness gate's ponder half without TRL: the part that reads ponder's own
trainer internals (its reference pass, its micro-batch objective), so a refactor that
breaks the gate shows here in every `make test`, not only after `make bench-setup`."""

import math

from bench.gate import _ponder_batch, _ponder_loss_and_grads, _ponder_trainer, gate_config
from ponder.models import tiny_policy


def test_the_gates_ponder_half_gives_a_real_loss_against_the_base_as_reference(tmp_path):
    policy = tiny_policy()
    policy.model.save_pretrained(tmp_path)
    policy.tokenizer.save_pretrained(tmp_path)
    cfg = gate_config(str(tmp_path), lora_r=4, lora_alpha=8)
    losses = {}
    for dtype in ("float64", "float32"):
        trainer, _ = _ponder_trainer(cfg, None, dtype)
        batch, _ = _ponder_batch(trainer, cfg, cfg.seed)
        loss, grads, logprobs = _ponder_loss_and_grads(trainer, batch)
        mask = batch.loss_mask.bool()
        # the reference is the base (adapters off), the policy its random adapters: they differ
        assert (batch.ref_logprobs[mask] - logprobs[mask]).abs().max() > 1e-3
        assert len(grads) == 28 and all(g.abs().sum() > 0 for g in grads.values())  # 2 layers × 7 × (A, B)
        assert math.isfinite(loss) and abs(loss) > 1e-3
        losses[dtype] = loss
    assert abs(losses["float32"] - losses["float64"]) <= 1e-4 * abs(losses["float64"])
