"""The `hf` generation backend on a tiny random Llama, alone and under the rollout engine."""

import dataclasses

import pytest
import torch

from ponder.config import RolloutConfig, SamplingConfig
from ponder.envs.data import load_search_qa
from ponder.envs.search_qa import SearchQAEnvFactory, SearchQAOptions
from ponder.envs.synthetic import TaskGenConfig
from ponder.models import tiny_policy, token_logprobs
from ponder.rollout import GenerationRequest, HFBackend, RolloutEngine
from ponder.rollout.hf import shared_prefix_length
from ponder.rollout.backend import first_stop
from ponder.tools.retrieval import build_retriever

CONTEXTS = [
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<think>I need to search for this.</think>\n<search>",
    "What year was the company founded? <answer>",
]
MAX_NEW = [7, 20, 13]  # rows finish at different steps, so finished rows leave the batch and cache


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # A 64-wide model's ops are far too small to split across threads; on a busy
    # 2-core machine intra-op threads wait on each other and this file runs 4x slower.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def policy():
    return tiny_policy(seed=0)


@pytest.fixture(scope="module")
def spiky():
    """The tiny model with larger random weights: its greedy continuations change from
    token to token and depend on the whole context, where the default initialisation
    repeats one token, which any padding or cache mistake would still reproduce."""
    policy = tiny_policy(seed=0)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in policy.model.parameters():
            if param.dim() == 2:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.25)
    return policy


def contexts(policy):
    return [policy.tokenizer.encode(text, add_special_tokens=False) for text in CONTEXTS]


def requests(policy, max_new=MAX_NEW):
    return [GenerationRequest(f"row{i}", ids, n) for i, (ids, n) in enumerate(zip(contexts(policy), max_new))]


def recomputed_logprobs(policy, context, generated, temperature):
    ids = torch.tensor([context + generated])
    with torch.no_grad():
        scores = token_logprobs(policy.model, ids, torch.ones_like(ids), temperature)[0]
    return scores[len(context) - 1 :]


def greedy(policy, **overrides):
    return HFBackend(policy, SamplingConfig(temperature=0.0, **overrides), seed=0)


def test_greedy_batch_equals_each_row_alone(spiky):
    backend = greedy(spiky)
    batch = requests(spiky)
    assert len({len(r.context_ids) for r in batch}) == 3
    together = backend.generate(batch, [])
    alone = [backend.generate([request], [])[0] for request in batch]
    assert [g.token_ids for g in together] == [g.token_ids for g in alone]
    assert [len(g.token_ids) for g in together] == MAX_NEW
    assert all(len(set(g.token_ids)) > 3 for g in together)  # not a repeated token
    for a, b in zip(together, alone):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
        assert a.text == b.text == spiky.tokenizer.decode(a.token_ids, skip_special_tokens=True)


def test_finished_rows_left_in_the_batch_change_nothing(spiky, monkeypatch):
    # Five rows, the small-batch rule off: when the first finishes (step 7) four of
    # five still generate, so it stays in the batch and cache (hf.COMPACT_AT) until
    # the fifth finishes (step 13).
    from ponder.rollout import hf

    monkeypatch.setattr(hf, "SMALL_BATCH", 0)
    assert 4 > 5 * hf.COMPACT_AT >= 3
    ids = contexts(spiky)
    max_new = [7, 20, 20, 20, 13]
    batch = [GenerationRequest(f"row{i}", ids[i % 3], n) for i, n in enumerate(max_new)]
    backend = greedy(spiky)
    together = backend.generate(batch, [])
    alone = [backend.generate([request], [])[0] for request in batch]
    assert [len(g.token_ids) for g in together] == max_new
    assert [g.token_ids for g in together] == [g.token_ids for g in alone]
    for a, b in zip(together, alone):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


def test_greedy_batch_equals_each_row_alone_with_absolute_positions():
    # Llama's rotary positions are relative, so a constant position offset from the
    # padding cannot show; GPT-2's learned absolute positions expose wrong position ids.
    from transformers import GPT2Config, GPT2LMHeadModel

    from ponder.models import Policy, tiny_tokenizer

    tokenizer = tiny_tokenizer()
    eos = tokenizer.eos_token_id
    config = GPT2Config(
        vocab_size=len(tokenizer), n_embd=32, n_layer=2, n_head=2, n_positions=256,
        initializer_range=0.3, bos_token_id=eos, eos_token_id=eos,
    )  # fmt: skip
    state = torch.random.get_rng_state()
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config).eval()
    torch.random.set_rng_state(state)
    policy = Policy(model, tokenizer, "gpt2-tiny", torch.device("cpu"))
    backend = greedy(policy)
    batch = requests(policy)
    together = backend.generate(batch, [])
    alone = [backend.generate([request], [])[0] for request in batch]
    assert [g.token_ids for g in together] == [g.token_ids for g in alone]
    assert [len(g.token_ids) for g in together] == MAX_NEW
    for request, generation in zip(batch, together):
        expected = recomputed_logprobs(policy, request.context_ids, generation.token_ids, 1.0)
        assert torch.allclose(torch.tensor(generation.logprobs), expected, atol=1e-4)


def test_max_new_tokens_gives_finish_reason_length(spiky):
    generations = greedy(spiky).generate(requests(spiky, [1, 4, 9]), [])
    assert [len(g.token_ids) for g in generations] == [1, 4, 9]
    assert [len(g.logprobs) for g in generations] == [1, 4, 9]
    assert [g.finish_reason for g in generations] == ["length"] * 3


def test_greedy_logprobs_are_untempered(spiky):
    batch = requests(spiky)
    for request, generation in zip(batch, greedy(spiky).generate(batch, [])):
        expected = recomputed_logprobs(spiky, request.context_ids, generation.token_ids, 1.0)
        assert torch.allclose(torch.tensor(generation.logprobs), expected, atol=1e-4)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_logprobs_equal_a_fresh_recomputation(policy, spiky, temperature):
    for model in (policy, spiky):
        backend = HFBackend(model, SamplingConfig(temperature=temperature), seed=3)
        batch = requests(model)
        for request, generation in zip(batch, backend.generate(batch, [])):
            assert len(generation.logprobs) == len(generation.token_ids) <= request.max_new_tokens
            assert generation.finish_reason == (
                "eos" if generation.token_ids[-1] == model.tokenizer.eos_token_id else "length"
            )
            expected = recomputed_logprobs(model, request.context_ids, generation.token_ids, temperature)
            assert torch.allclose(torch.tensor(generation.logprobs), expected, atol=1e-4)


def test_same_seed_same_samples_other_seed_other_samples(policy):
    sampling = SamplingConfig(temperature=1.0)
    runs = [HFBackend(policy, sampling, seed=s).generate(requests(policy), []) for s in (5, 5, 6)]
    ids = [[g.token_ids for g in run] for run in runs]
    assert ids[0] == ids[1]
    assert ids[0] != ids[2]


def test_stop_string_ends_generation_at_its_first_appearance(spiky):
    request = requests(spiky, [14, 14, 14])[1]
    reference = greedy(spiky).generate([request], [])[0].token_ids
    decode = spiky.tokenizer.decode
    # a printable stop string taken from the middle of the greedy continuation
    stop = next(
        text
        for start in range(2, 12)
        for text in [decode(reference[start : start + 2])]
        if text.isascii()
        and text.isprintable()
        and len(text) >= 2
        and text not in decode(reference[: start + 1])
    )
    expected_length = next(n for n in range(1, 15) if first_stop(decode(reference[:n]), [stop]) >= 0)
    generation = greedy(spiky).generate([request], ["never appears \x00", stop])[0]
    assert generation.finish_reason == "stop"
    assert generation.token_ids == reference[:expected_length]
    assert stop in generation.text and stop not in decode(generation.token_ids[:-1])
    # the other rows of a batch are not cut by one row's stop
    batch = requests(spiky, [14, 14, 14])
    together = greedy(spiky).generate(batch, [stop])
    assert together[1].token_ids == generation.token_ids
    for row in (0, 2):
        alone = greedy(spiky).generate([batch[row]], [stop])[0]
        assert together[row].token_ids == alone.token_ids
        assert together[row].finish_reason == alone.finish_reason


def test_eos_token_ends_generation(spiky):
    request = requests(spiky, [12, 12, 12])[2]
    reference = greedy(spiky).generate([request], [])[0].token_ids
    assert spiky.tokenizer.eos_token_id not in reference
    # a model whose generation config lists an extra end-of-turn token (as Llama 3 does)
    end_token = reference[4]
    first = reference.index(end_token)
    saved = spiky.model.generation_config.eos_token_id
    spiky.model.generation_config.eos_token_id = [spiky.tokenizer.eos_token_id, end_token]
    try:
        backend = greedy(spiky)
    finally:
        spiky.model.generation_config.eos_token_id = saved
    generation = backend.generate([request], [])[0]
    assert generation.finish_reason == "eos"
    assert generation.token_ids == reference[: first + 1]


def test_empty_request_list(policy):
    assert greedy(policy).generate([], ["</search>"]) == []


# ---------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def world():
    data = load_search_qa(SearchQAOptions(taskgen=TaskGenConfig(seed=0, n_people=30, n_train=8, n_eval=4)))
    return data, build_retriever("bm25", data.corpus)


SAMPLING = SamplingConfig(temperature=1.0, max_new_tokens_per_turn=12, max_total_tokens=512)


def rollout(policy, world, sampling=SAMPLING, batch_size=8, seed=0, backend=None):
    data, retriever = world
    env_factory = SearchQAEnvFactory(
        retriever, topk=2, max_turns=3, max_obs_tokens=64, tokenizer=policy.tokenizer
    )
    config = RolloutConfig(batch_size=batch_size, group_size=2, seed=seed, sampling=sampling)
    backend = backend or HFBackend(policy, sampling, seed=seed)
    return RolloutEngine(backend, env_factory, config).run(data.train[:4])


@pytest.fixture(scope="module")
def sampled(policy, world):
    return rollout(policy, world)


def test_end_to_end_trajectories_are_consistent(policy, world, sampled):
    data, _ = world
    trajectories, stats = sampled
    assert [t.task_id for t in trajectories] == [task.id for task in data.train[:4] for _ in range(2)]
    for trajectory in trajectories:
        trajectory.check()
        assert sum(trajectory.loss_mask) == trajectory.metrics["generated_tokens"]
        assert sum(t.n_action_tokens for t in trajectory.turns) == trajectory.metrics["generated_tokens"]
        assert sum(t.n_observation_tokens for t in trajectory.turns) == trajectory.loss_mask.count(0)
        assert len(trajectory.prompt_ids) + len(trajectory.response_ids) <= SAMPLING.max_total_tokens
        assert all(t.n_action_tokens <= SAMPLING.max_new_tokens_per_turn for t in trajectory.turns)
        assert trajectory.stop_reason in {"answer", "max_turns", "max_tokens"}
        observations = "".join(t.observation or "" for t in trajectory.turns)
        ids = [i for i, m in zip(trajectory.response_ids, trajectory.loss_mask) if m == 0]
        assert policy.tokenizer.decode(ids, skip_special_tokens=False) == observations
        assert all(lp == 0.0 for lp, m in zip(trajectory.old_logprobs, trajectory.loss_mask) if m == 0)
    assert stats.generated_tokens == sum(sum(t.loss_mask) for t in trajectories)
    assert stats.episodes == 8


def test_end_to_end_old_logprobs_match_the_trainers_recomputation(policy, sampled):
    # the trainer scores prompt + response as one sequence: the behaviour logprobs
    # recorded turn by turn (with observations spliced in) must be the same numbers
    trajectories, _ = sampled
    for trajectory in trajectories:
        expected = recomputed_logprobs(
            policy, trajectory.prompt_ids, trajectory.response_ids, SAMPLING.temperature
        )
        mask = torch.tensor(trajectory.loss_mask, dtype=torch.bool)
        recorded = torch.tensor(trajectory.old_logprobs)
        assert torch.allclose(recorded[mask], expected[mask], atol=1e-4)


def test_end_to_end_samples_of_one_task_differ(sampled):
    trajectories, _ = sampled
    pairs = [(trajectories[i], trajectories[i + 1]) for i in range(0, 8, 2)]
    assert all(a.group_id == b.group_id for a, b in pairs)
    assert any(a.response_ids != b.response_ids for a, b in pairs)


def test_end_to_end_same_seed_reproduces(policy, world, sampled):
    again, _ = rollout(policy, world)
    assert [t.response_ids for t in again] == [t.response_ids for t in sampled[0]]


def test_end_to_end_greedy_does_not_depend_on_batch_size(spiky, world):
    sampling = dataclasses.replace(SAMPLING, temperature=0.0, max_new_tokens_per_turn=6)
    wide, _ = rollout(spiky, world, sampling=sampling, batch_size=8)
    narrow, _ = rollout(spiky, world, sampling=sampling, batch_size=3)
    assert [t.response_ids for t in wide] == [t.response_ids for t in narrow]
    assert [t.loss_mask for t in wide] == [t.loss_mask for t in narrow]


class Counting:
    """A sampling model (ponder's lean decoder or a transformers model) that counts the
    tokens it reads."""

    def __init__(self, model):
        self.model, self.config, self.tokens_read = model, model.config, 0

    def __call__(self, **kwargs):
        self.tokens_read += int(kwargs["attention_mask"][:, -kwargs["input_ids"].shape[1] :].sum())
        return self.model(**kwargs)


def counting_backend(policy, sampling, reuse_kv):
    """An HFBackend whose sampling model counts the tokens it reads (`.tokens_read`)."""
    backend = HFBackend(policy, sampling, seed=0, reuse_kv=reuse_kv)
    backend._sampler = Counting(backend.sampling_model())
    return backend


def tokens_read(backend):
    return backend._sampler.tokens_read


def test_end_to_end_reusing_each_episodes_cache_changes_nothing_but_the_work(spiky, world):
    sampling = dataclasses.replace(SAMPLING, temperature=0.0, max_new_tokens_per_turn=6)
    reused = counting_backend(spiky, sampling, reuse_kv=True)
    fresh = counting_backend(spiky, sampling, reuse_kv=False)
    with_reuse, _ = rollout(spiky, world, sampling=sampling, backend=reused)
    without, _ = rollout(spiky, world, sampling=sampling, backend=fresh)
    assert all(len(t.turns) == 3 for t in with_reuse)  # later turns could reuse the cache
    assert [t.response_ids for t in with_reuse] == [t.response_ids for t in without]
    for a, b in zip(with_reuse, without):
        assert torch.allclose(torch.tensor(a.old_logprobs), torch.tensor(b.old_logprobs), atol=1e-5)
    # without reuse every turn re-reads the whole conversation; with it, each token is
    # read once, and the two samples of a task share one read of their prompt
    expected = sum(len(t.prompt_ids) // 2 + len(t.response_ids) for t in with_reuse)
    assert tokens_read(reused) < tokens_read(fresh)
    assert tokens_read(reused) <= expected + len(with_reuse)


def test_shared_prefix_length_leaves_a_token_to_read():
    assert shared_prefix_length([[1, 2, 3, 4], [1, 2, 5], [1, 2, 3]]) == 2
    assert shared_prefix_length([[1, 2, 3], [1, 2, 3]]) == 2  # identical: all but the last
    assert shared_prefix_length([[1, 2], [3, 4]]) == 0
    assert shared_prefix_length([[7]]) == 0


def test_new_episodes_read_their_common_prefix_once(spiky):
    # distinct contexts behind one shared system prompt: the prompt is read once, then
    # each row's own tail (the same tokens as without any reuse, fewer of them)
    system = spiky.tokenizer.encode(CONTEXTS[0] * 3, add_special_tokens=False)
    tails = [spiky.tokenizer.encode(t, add_special_tokens=False) for t in CONTEXTS]
    batch = [GenerationRequest(f"r{i}", system + tail, 5) for i, tail in enumerate(tails)]
    sampling = SamplingConfig(temperature=0.0)
    shared, alone = counting_backend(spiky, sampling, True), counting_backend(spiky, sampling, False)
    out = shared.generate(batch, [])
    assert [g.token_ids for g in out] == [g.token_ids for g in alone.generate(batch, [])]
    decode_steps = sum(len(g.token_ids) - 1 for g in out)
    assert tokens_read(shared) == len(system) + sum(len(t) for t in tails) + decode_steps
