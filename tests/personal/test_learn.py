"""update_user: DPO on one user's pairs trains only that user's adapter (another user's
files and the base weights untouched), the margin rises, later updates continue the
current version, and an adapter from another base or too little feedback is refused."""

from __future__ import annotations

import pytest

from ponder.models import tiny_policy
from ponder.models.base_hash import base_model_hash
from ponder.personal.config import PersonalConfig
from ponder.personal.feedback import PreferencePair
from ponder.personal.learn import pair_examples, update_user
from ponder.personal.store import AdapterStore

from .conftest import lora_state

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
# DPO alone (rpo_alpha 0): the margin checks below are DPO's; the NLL term is tested in
# tests/train/test_sft_trainer.py and measured on the real model in docs/results/personal.md.
FAST = PersonalConfig(steps=6, batch_size=2, micro_batch_size=2, lr=2e-2, beta=0.5, rpo_alpha=0.0, lora_r=4,
                      lora_alpha=8)


def test_pairs_are_tokenised_as_the_server_renders_them():
    tokenizer = tiny_policy().tokenizer
    (example,), too_long = pair_examples(tokenizer, [PreferencePair(QUESTION, "Paris.", "Lyon.", "rewrite")], 512)
    prompt = tokenizer.apply_chat_template(QUESTION, tokenize=False, add_generation_prompt=True)
    for side, text in ((example.chosen, "Paris."), (example.rejected, "Lyon.")):
        start = side.loss_mask.index(1)
        assert tokenizer.decode(side.input_ids[:start]) == prompt and set(side.loss_mask[start:]) == {1}
        assert tokenizer.decode(side.input_ids[start:]) == text + "<|im_end|>"
    assert too_long == 0
    assert pair_examples(tokenizer, [PreferencePair(QUESTION, "Paris.", "Lyon.", "rewrite")], 10) == ([], 1)


def _store_with_feedback(root, adapter_dirs, tiny_hash):
    store = AdapterStore(root)
    for index, response in enumerate(["Lyon is it.", "Marseille."]):
        chat = store.log_interaction("alice", QUESTION, response)
        store.add_feedback(chat, "down")
        store.add_feedback(chat, "rewrite", text="Paris is the capital of France.")
    store.save_version("bob", adapter_dirs["two"], tiny_hash)
    return store


def test_an_update_trains_only_that_users_adapter(tmp_path, adapter_dirs, tiny_hash):
    store = _store_with_feedback(tmp_path, adapter_dirs, tiny_hash)
    bob_before = {name: t.clone() for name, t in lora_state(store.adapter_path("bob")).items()}
    policy = tiny_policy()
    version, metrics = update_user(store, "alice", policy, FAST)
    assert version == 1 and store.current("alice").version == 1
    assert (metrics["pairs"], metrics["feedback"], metrics["parent_version"]) == (2, 4, None)
    assert metrics["margin_first"] == pytest.approx(0.0, abs=1e-5)  # a fresh LoRA is the base
    assert metrics["margin_last"] > 0.5 and metrics["loss_last"] < metrics["loss_first"]
    assert base_model_hash(policy.model) == tiny_hash  # the base weights did not move
    trained = store.current("alice")
    assert (trained.base_hash, trained.steps, trained.pairs, trained.feedback) == (tiny_hash, 6, 2, 4)
    assert any(t.abs().max() > 0 for name, t in lora_state(trained.path).items() if "lora_B" in name)
    bob_after = lora_state(store.adapter_path("bob"))
    assert bob_after.keys() == bob_before.keys() and all((bob_after[k] == v).all() for k, v in bob_before.items())
    assert [v.version for v in store.versions("bob")] == [1]

    # the next update continues v1 (same pairs: the margin starts where v1 left it)
    version, again = update_user(store, "alice", tiny_policy, FAST)
    assert version == 2 and again["parent_version"] == 1 and store.current("alice").steps == 12
    assert again["margin_first"] > metrics["margin_last"] - 0.1 and again["margin_last"] > again["margin_first"]


def test_an_update_refuses_another_base_and_too_little_feedback(tmp_path, adapter_dirs, tiny_hash):
    store = _store_with_feedback(tmp_path, adapter_dirs, tiny_hash)
    store.save_version("alice", adapter_dirs["one"], tiny_hash)
    with pytest.raises(ValueError, match=r"user alice v1 was trained on base .*, this model is "):
        update_user(store, "alice", lambda: tiny_policy(seed=1), FAST)
    chat = store.log_interaction("carol", QUESTION, "Rome.")
    store.add_feedback(chat, "down")
    with pytest.raises(ValueError, match=r"user carol: 0 preference pair\(s\) from 1 feedback row\(s\) "
                                         r"\(1 down without alternative\); an update needs at least 1"):
        update_user(store, "carol", tiny_policy, FAST)
    assert [v.version for v in store.versions("alice")] == [1] and store.versions("carol") == []


def test_update_settings_are_checked():
    with pytest.raises(ValueError, match="steps must be an integer >= 1"):
        PersonalConfig(steps=0)
    with pytest.raises(ValueError, match="unknown update setting 'stepz'"):
        FAST.with_overrides({"stepz": 3})
    with pytest.raises(ValueError, match="^loss: unknown preference loss 'x'; valid: hinge, ipo, sigmoid$"):
        FAST.with_overrides({"loss": "x"})
    assert FAST.with_overrides({"steps": 3}).steps == 3
