"""Several LoRA adapters on one tiny base: a batch sampled with a different adapter
per row gives each row what that adapter alone gives, a step on one adapter leaves
another's weights and optimizer state bit for bit, `ponder train-adapters` writes a
loadable adapter per name, and bad names fail with one line."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import torch

from ponder.config import LoraConfig
from ponder.jobs.adapters import adapter_recipes, multi_adapter_trainer, read_adapters_file
from ponder.models import tiny_policy
from ponder.models.multi_lora import activate, adapter_parameters, attach_lora_adapters, check_adapter
from ponder.rewards import register_reward
from ponder.rollout.multi_adapter import adapter_of_key

TINY = [
    "model.name=tiny", "train.steps=2", "train.tasks_per_step=2", "rollout.group_size=2",
    "rollout.batch_size=4", "rollout.sampling.max_new_tokens_per_turn=8", "env.max_turns=2",
    "env.options.max_obs_tokens=16", "env.options.taskgen.n_people=20", "env.options.taskgen.n_train=16",
    "env.options.taskgen.n_eval=4", "lora.r=4", "algo.micro_batch_size=2", "train.save_every=1",
]  # fmt: skip


def low_id_share(trajectory, task):
    """Share of the policy's tokens with id < 256: it differs between samples of the
    random model, so every group carries a learning signal."""
    generated = [t for t, m in zip(trajectory.response_ids, trajectory.loss_mask) if m == 1]
    return sum(t < 256 for t in generated) / max(1, len(generated))


LEARNS = 'reward.terms={"multi_adapter_test_low_ids": 1.0}'


@pytest.fixture
def learnable_reward():
    """low_id_share as a reward component for this test only (other tests list the registry)."""
    from ponder.rewards import REWARDS

    register_reward("multi_adapter_test_low_ids")(low_id_share)
    yield
    REWARDS._items.pop("multi_adapter_test_low_ids", None)
    REWARDS._traits.pop("multi_adapter_test_low_ids", None)


def two_adapters():
    policy = attach_lora_adapters(tiny_policy(), {"alice": LoraConfig(r=4, alpha=8), "bob": LoraConfig(r=2, alpha=4)},
                                  {"alice": 1, "bob": 2})  # fmt: skip
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # a fresh LoRA's B is zero: give each adapter an effect of its own
        for name in ("alice", "bob"):
            for key, param in adapter_parameters(policy.model, name).items():
                if "lora_B" in key:
                    param.copy_(torch.randn(param.shape, generator=generator) * 0.3)
    return policy


def test_each_row_of_a_mixed_batch_gets_what_its_adapter_alone_gives():
    from ponder.models.multi_lora import rows_with_adapters

    policy = two_adapters()
    model = policy.model
    ids = torch.randint(5, 200, (3, 7), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        with rows_with_adapters(["alice", "bob", None]):
            mixed = model(input_ids=ids).logits
        alone = {}
        for name in ("alice", "bob"):
            activate(model, name)
            alone[name] = model(input_ids=ids).logits
        with model.disable_adapter():
            base = model(input_ids=ids).logits
    torch.testing.assert_close(mixed[0], alone["alice"][0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mixed[1], alone["bob"][1], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mixed[2], base[2], rtol=1e-5, atol=1e-5)
    assert (alone["alice"][0] - alone["bob"][0]).abs().max() > 1e-2  # the adapters do differ


def test_a_mixed_batch_samples_what_each_adapter_samples_alone():
    """Greedy decoding through the lean multi-adapter decoder, rows of two adapters in
    one batch, against each adapter merged into the single-adapter backend's decoder."""
    from dataclasses import replace

    from ponder.config import SamplingConfig
    from ponder.rollout.backend import GenerationRequest
    from ponder.rollout.hf import HFBackend
    from ponder.rollout.multi_adapter import MultiAdapterBackend, MultiLoraDecoder

    policy = two_adapters()
    sampling = SamplingConfig(temperature=0.0, max_new_tokens_per_turn=12, dtype="float32")
    contexts = [[5, 9, 31, 7], [12, 40, 3], [8, 8, 100, 21, 6]]
    backend = MultiAdapterBackend(policy, sampling, reuse_kv=False)
    assert isinstance(backend.sampling_model(), MultiLoraDecoder)
    keys = ["alice/t0#0", "bob/t1#0", "alice/t2#0", "bob/t0#0"]
    mixed = backend.generate([GenerationRequest(k, contexts[i % 3], 12) for i, k in enumerate(keys)], [])
    for i, (key, got) in enumerate(zip(keys, mixed)):
        activate(policy.model, key.partition("/")[0])
        alone = HFBackend(replace(policy), sampling, reuse_kv=False)
        [want] = alone.generate([GenerationRequest("x", contexts[i % 3], 12)], [])
        assert got.token_ids == want.token_ids, key
        assert got.logprobs == pytest.approx(want.logprobs, abs=1e-4), key
    assert mixed[0].token_ids != mixed[3].token_ids  # one context, two adapters: two continuations


def snapshot(trainer, name):
    params = {k: p.detach().clone() for k, p in adapter_parameters(trainer.policy.model, name).items()}
    return params, copy.deepcopy(trainer.trainers[name].optimizer.state_dict())


def test_a_step_on_one_adapter_leaves_the_other_bit_for_bit(tmp_path, learnable_reward):
    adapters = {"alice": ["optim.lr=1e-2", "train.seed=1"], "bob": ["optim.lr=1e-3", "train.seed=2", "train.steps=1"]}
    trainer = multi_adapter_trainer(adapter_recipes(None, [*TINY, LEARNS], adapters), tmp_path / "run")
    first = trainer.train_step()
    assert set(first) == {"alice", "bob"} and first["alice"]["multi/adapters_sampled_together"] == 2.0
    assert first["alice"]["optim/grad_norm"] > 0 and first["bob"]["optim/grad_norm"] > 0
    for one in trainer.trainers.values():
        one.step += 1
    b_params, b_optim = snapshot(trainer, "bob")
    a_params, _ = snapshot(trainer, "alice")
    assert b_optim["state"], "bob's first step filled its optimizer state"
    second = trainer.train_step()  # bob has done his one step: only alice trains
    assert set(second) == {"alice"}
    b_after, b_optim_after = snapshot(trainer, "bob")
    for key, value in b_params.items():
        assert torch.equal(value, b_after[key]), key
    for index, state in b_optim["state"].items():
        for field, value in state.items():
            assert torch.equal(value, b_optim_after["state"][index][field]), (index, field)
    a_after, _ = snapshot(trainer, "alice")
    assert any(not torch.equal(v, a_after[k]) for k, v in a_params.items()), "alice's step moved her weights"


def test_train_adapters_writes_a_loadable_adapter_per_name(tmp_path):
    from peft import PeftModel

    from ponder.models.adapters import saved_weights

    spec = tmp_path / "adapters.yaml"
    spec.write_text("alice: {optim.lr: 1.0e-2, train.seed: 1}\nbob: {optim.lr: 1.0e-3, lora.r: 2}\n")
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "ponder.cli", "train-adapters", str(spec), "--out", str(out),
                           *TINY, "train.steps=1"], capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "alice" in done.stderr and "step 1/1" in done.stderr
    shapes = {}
    for name in ("alice", "bob"):
        checkpoint = out / "adapters" / name / "checkpoints" / "step-000001"
        weights = saved_weights(checkpoint)
        shapes[name] = {v.shape[0] for k, v in weights.items() if "lora_A" in k}  # the rank
        loaded = PeftModel.from_pretrained(tiny_policy().model, str(checkpoint))
        for key, value in loaded.named_parameters():
            if "lora_" in key:
                stored = key.replace(".default", "")
                assert torch.equal(value.detach(), weights[stored]), key
    assert shapes == {"alice": {4}, "bob": {2}}


def test_unknown_adapters_and_bad_files_fail_with_one_line(tmp_path):
    policy = two_adapters()
    with pytest.raises(ValueError, match=r"adapter 'carol' does not exist; this model has alice, bob"):
        check_adapter(policy.model, "carol")
    with pytest.raises(ValueError, match=r"adapter 'carol' does not exist; this model has alice, bob"):
        adapter_of_key("carol/task-1#0", ["alice", "bob"])
    bad = tmp_path / "bad.yaml"
    for text, message in [("- alice\n", "write a mapping of adapter name"),
                          ("'a b': {}\n", "use 1-64 letters"),
                          ("alice: 3\n", "adapter alice: its overrides must be a mapping"),
                          ("alice: [oops\n", "not YAML"), ("a: {}\n", "part of .lora_.")]:  # fmt: skip
        bad.write_text(text)
        with pytest.raises(ValueError, match=message):
            read_adapters_file(bad)
    with pytest.raises(ValueError, match="model.name is shared by every adapter"):
        adapter_recipes(None, TINY, {"alice": ["model.name=other"]})
    with pytest.raises(ValueError, match="multi-adapter training does not support train.async_rollouts"):
        multi_adapter_trainer(adapter_recipes(None, TINY, {"alice": ["train.async_rollouts=true"]}),
                              tmp_path / "run")  # fmt: skip
    done = subprocess.run([sys.executable, "-m", "ponder.cli", "train-adapters", str(tmp_path / "none.yaml"),
                           "--out", str(tmp_path / "never")], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode != 0 and "cannot read the adapters file" in done.stderr
    assert not (tmp_path / "never").exists()
