"""SFT warm-up: demonstration scripts, replayed demonstrations (real observations,
masked out), and a short LoRA fine-tune of the tiny model that lowers the NLL."""

import pytest
import torch

from ponder.config import LoraConfig, SFTConfig, load_recipe
from ponder.envs.data import load_search_qa
from ponder.envs.search_qa import SearchQAEnvFactory, SearchQAOptions
from ponder.models import apply_lora, tiny_policy
from ponder.models.forward import forward_policy
from ponder.tools.retrieval import build_retriever
from ponder.train.batch import collate
from ponder.train.rl import check_recipe
from ponder.train.sft import build_demonstrations, demonstration_actions, demonstration_scripts, sft_train

RECIPE = [
    "model.name=tiny",
    "env.options.taskgen.n_people=20",
    "env.options.taskgen.n_train=16",
    "env.options.taskgen.n_eval=4",
    "env.options.max_obs_tokens=32",
    "env.options.retriever.topk=1",
    "rollout.sampling.max_new_tokens_per_turn=256",  # tiny-tokenizer actions run to ~100 tokens
]


@pytest.fixture(scope="module")
def recipe():
    return load_recipe(None, RECIPE)


@pytest.fixture(scope="module")
def data(recipe):
    return load_search_qa(SearchQAOptions.from_recipe(recipe))


@pytest.fixture(scope="module")
def by_kind(data):
    kinds = {}
    for task in data.train:
        kinds.setdefault(task.kind, []).append(task)
    return kinds


@pytest.fixture(scope="module")
def tasks(by_kind):
    """Eight tasks: three single-hop, two multi-hop, three answerable from the prompt."""
    return by_kind["single_hop"][:3] + by_kind["multi_hop"][:2] + by_kind["in_prompt"][:3]


@pytest.fixture(scope="module")
def tokenizer_policy():
    return tiny_policy(seed=0)


@pytest.fixture(scope="module")
def demonstrations(tasks, data, recipe, tokenizer_policy):
    retriever = build_retriever("bm25", data.corpus)
    factory = SearchQAEnvFactory.from_recipe(recipe, retriever, tokenizer_policy.tokenizer)
    return build_demonstrations(tasks, "always_search", factory, tokenizer_policy, recipe)


def test_always_search_inserts_a_search_for_the_question_before_the_oracle_answer(by_kind):
    task = by_kind["in_prompt"][0]
    assert not any("<search>" in a for a in task.oracle_actions)
    actions = demonstration_actions(task, "always_search")
    assert actions == [
        f"<think>I will look this up.</think>\n<search>{task.question}</search>",
        *task.oracle_actions,
    ]


def test_oracle_and_searching_tasks_keep_their_oracle_actions(by_kind):
    for task in (by_kind["single_hop"][0], by_kind["multi_hop"][0], by_kind["in_prompt"][0]):
        assert demonstration_actions(task, "oracle") == task.oracle_actions
    for task in (by_kind["single_hop"][0], by_kind["multi_hop"][0]):
        assert demonstration_actions(task, "always_search") == task.oracle_actions


def test_unknown_behaviour_lists_the_valid_ones(by_kind):
    message = "unknown SFT behaviour 'always-search'; valid: oracle, always_search, search_once"
    with pytest.raises(ValueError, match=message):
        demonstration_actions(by_kind["in_prompt"][0], "always-search")


def test_search_once_searches_exactly_once_whatever_the_question(by_kind):
    single, in_prompt = by_kind["single_hop"][0], by_kind["in_prompt"][0]
    assert demonstration_actions(single, "search_once") == single.oracle_actions
    assert demonstration_actions(in_prompt, "search_once") == demonstration_actions(in_prompt, "always_search")
    multi = by_kind["multi_hop"][0]
    bridge = multi.metadata["hops"][0]
    actions = demonstration_actions(multi, "search_once")
    assert actions[0] == multi.oracle_actions[0]
    assert actions[1] == f"<think>The information says {bridge['fact']}.</think>\n<answer>{bridge['object']}</answer>"
    assert len(actions) == 2 and bridge["object"] not in multi.answers


def test_oracle_fraction_mixes_oracle_and_behaviour_demonstrations(data):
    tasks = data.train
    multi = [t for t in tasks if t.kind == "multi_hop"]
    assert demonstration_scripts(tasks, "search_once", 0.0, 0) == {
        t.id: demonstration_actions(t, "search_once") for t in tasks
    }
    assert demonstration_scripts(tasks, "search_once", 1.0, 0) == {t.id: t.oracle_actions for t in tasks}
    task = multi[0]
    picks = [demonstration_scripts([task], "search_once", 0.5, seed)[task.id] for seed in range(200)]
    assert 70 < sum(p == task.oracle_actions for p in picks) < 130
    assert all(p in (task.oracle_actions, demonstration_actions(task, "search_once")) for p in picks)
    assert demonstration_scripts(tasks, "search_once", 0.5, 3) == demonstration_scripts(tasks, "search_once", 0.5, 3)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("sft.behaviour=always-search", "sft.behaviour: unknown 'always-search'; valid: oracle, always_search, search_once"),
        ("sft.oracle_fraction=1.5", r"sft.oracle_fraction must be in \[0, 1\], got 1.5"),
    ],
)
def test_bad_sft_settings_fail_the_recipe_check(override, message):
    with pytest.raises(ValueError, match=message):
        check_recipe(load_recipe(None, RECIPE + [override]))


def test_demonstrations_answer_with_the_gold_after_the_scripted_turns(demonstrations, tasks):
    assert len(demonstrations) == len(tasks)
    for demo, task in zip(demonstrations, tasks):
        assert demo.task_id == task.id
        assert [turn.action for turn in demo.turns] == demonstration_actions(task, "always_search")
        assert all(turn.error is None for turn in demo.turns)
        assert demo.final_answer == task.answers[0]
        searches = sum(c.name == "search" for t in demo.turns for c in t.tool_calls)
        assert searches == {"single_hop": 1, "multi_hop": 2, "in_prompt": 1}[task.kind]
        assert len(demo.turns) == searches + 1


def test_masked_out_tokens_decode_to_exactly_the_observations(demonstrations, tokenizer_policy):
    tokenizer = tokenizer_policy.tokenizer
    for demo in demonstrations:
        demo.check()
        position = 0
        for turn in demo.turns:
            action = slice(position, position + turn.n_action_tokens)
            observation = slice(action.stop, action.stop + turn.n_observation_tokens)
            assert demo.loss_mask[action] == [1] * turn.n_action_tokens
            assert demo.loss_mask[observation] == [0] * turn.n_observation_tokens
            if turn.observation is None:
                assert turn.n_observation_tokens == 0
            else:
                assert "<information>" in turn.observation
                assert tokenizer.decode(demo.response_ids[observation]) == turn.observation
            position = observation.stop
        assert position == len(demo.response_ids)
        masked = [t for t, m in zip(demo.response_ids, demo.loss_mask) if m == 0]
        assert tokenizer.decode(masked) == "".join(t.observation or "" for t in demo.turns)


def test_demonstrations_never_hold_truncated_actions(tasks, data, tokenizer_policy):
    # The shipped recipes give 48 tokens per turn; SmolLM2 needs up to 54 for multi-hop
    # oracle actions, the tiny tokenizer about 100.
    recipe = load_recipe(None, RECIPE + ["rollout.sampling.max_new_tokens_per_turn=96"])
    retriever = build_retriever("bm25", data.corpus)
    factory = SearchQAEnvFactory.from_recipe(recipe, retriever, tokenizer_policy.tokenizer)
    for demo in build_demonstrations(tasks, "always_search", factory, tokenizer_policy, recipe):
        task = next(t for t in tasks if t.id == demo.task_id)
        assert [turn.action for turn in demo.turns] == demonstration_actions(task, "always_search")
        assert all(turn.error is None for turn in demo.turns)


def _masked_nll(policy, demonstrations):
    batch = collate(demonstrations, policy.tokenizer.pad_token_id)
    with torch.no_grad():
        logprobs, _, _ = forward_policy(policy.model, batch.input_ids, batch.attention_mask)
    return float(-(logprobs * batch.loss_mask).sum() / batch.loss_mask.sum())


# Over policy seeds 0-3: first-minus-last step loss 0.24-0.33 nats and the
# demonstrations' NLL drop 0.23-0.37 (from ≈ ln 512 = 6.24); 0.1 is under half the smallest.
MARGIN = 0.1


def test_sft_lowers_the_loss_and_the_demonstrations_nll(demonstrations):
    torch.manual_seed(0)  # LoRA's A matrices draw from the global RNG
    policy = apply_lora(tiny_policy(seed=0), LoraConfig(r=8, alpha=16))
    before = _masked_nll(policy, demonstrations)
    steps = []
    history = sft_train(
        policy, demonstrations, SFTConfig(steps=15, batch_size=4, lr=3e-3, warmup_steps=2),
        seed=0, micro_batch_size=2, on_step=lambda step, metrics: steps.append(step),
    )  # fmt: skip
    losses = [h["sft/loss"] for h in history]
    assert steps == list(range(1, 16))
    assert losses[-1] < losses[0] - MARGIN, losses
    assert _masked_nll(policy, demonstrations) < before - MARGIN
    assert not policy.model.training  # left in eval mode for the RL rollout that follows


def test_logged_sft_lr_is_the_lr_each_step_used(demonstrations):
    policy = apply_lora(tiny_policy(seed=0), LoraConfig(r=4, alpha=8))
    config = SFTConfig(steps=3, batch_size=1, lr=3e-3, warmup_steps=2)
    history = sft_train(policy, demonstrations[:1], config)
    assert [h["sft/lr"] for h in history] == pytest.approx([1.5e-3, 3e-3, 3e-3])


def test_no_demonstrations_is_an_error(tokenizer_policy):
    with pytest.raises(ValueError, match="no demonstrations"):
        sft_train(tokenizer_policy, [], SFTConfig(steps=1))
