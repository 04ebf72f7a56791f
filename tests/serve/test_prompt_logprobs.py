"""`/v1/completions` with vLLM's `prompt_logprobs`: the served model's log-probability
of every prompt token, with the top K, in vLLM's layout; what a URL teacher reads
(ponder.train.teacher.UrlTeacher) equals the in-process teacher's logprobs."""

from __future__ import annotations

import pytest
import torch
from openai import OpenAI

from ponder.models import tiny_policy
from ponder.models.logprobs import token_logprobs
from ponder.serve import ServeConfig
from ponder.train.batch import collate
from ponder.train.teacher import UrlTeacher
from ponder.train.update import forward_pass_no_grad
from ponder.types import Trajectory

from .conftest import running_server


@pytest.fixture(scope="module")
def teacher_server():
    with running_server(ServeConfig(model="tiny", max_tokens_limit=16)) as running:
        yield running


def test_prompt_logprobs_are_the_models_in_vllms_layout(teacher_server):
    policy = tiny_policy()
    ids = policy.tokenizer.encode("the cat sat on the mat")
    with OpenAI(base_url=teacher_server.url, api_key="x", max_retries=0) as client:
        reply = client.completions.create(model="tiny", prompt=ids, max_tokens=1, extra_body={"prompt_logprobs": 2})
    positions = reply.choices[0].model_extra["prompt_logprobs"]
    assert positions[0] is None and len(positions) == len(ids)
    expected = token_logprobs(policy.model, torch.tensor([ids]), torch.ones(1, len(ids)))[0]
    for t, position in enumerate(positions[1:]):
        own = position[str(ids[t + 1])]
        assert own["logprob"] == pytest.approx(expected[t].item(), abs=1e-4)
        ranks = sorted(entry["rank"] for entry in position.values())
        assert ranks[:2] == [1, 2] and len(position) in (2, 3)  # the top 2, and the prompt's token if not among them


def test_a_url_teacher_scores_like_the_in_process_one(teacher_server):
    policy = tiny_policy()
    teacher = UrlTeacher(teacher_server.url)
    teacher.check_tokenizer(policy.tokenizer)
    rows = [policy.tokenizer.encode(text) for text in ("one two three four", "a b c", "hello there, world")]
    trajectories = [Trajectory(f"t{i}", ids[:2], ids[2:], [1] * (len(ids) - 2), [0.0] * (len(ids) - 2))
                    for i, ids in enumerate(rows)]  # fmt: skip
    batch = collate(trajectories, policy.tokenizer.pad_token_id)
    remote = teacher(batch, 4, 1.0)
    local = forward_pass_no_grad(policy, batch, 4, 1.0)
    on = batch.loss_mask.bool()
    assert (remote[on] - local[on]).abs().max() < 1e-4


def test_bad_prompt_logprobs_are_400(teacher_server):
    import httpx

    reply = httpx.post(f"{teacher_server.url}/completions", json={"model": "tiny", "prompt": [1, 2, 3],
                                                                  "max_tokens": 1, "prompt_logprobs": 99})  # fmt: skip
    assert reply.status_code == 400 and "prompt_logprobs must be between 0 and 20" in reply.text


def test_a_url_teachers_top_k_is_the_in_process_ones(teacher_server):
    """teacher.loss topk through a server: the same k tokens, in the same order, with the
    same log-probabilities as the in-process teacher's top-k of its logits."""
    from ponder.train.teacher import ModelScorer

    policy = tiny_policy()
    rows = [policy.tokenizer.encode(text) for text in ("one two three four", "a b c")]
    trajectories = [Trajectory(f"t{i}", ids[:2], ids[2:], [1] * (len(ids) - 2), [0.0] * (len(ids) - 2))
                    for i, ids in enumerate(rows)]  # fmt: skip
    batch = collate(trajectories, policy.tokenizer.pad_token_id)
    remote_ids, remote = UrlTeacher(teacher_server.url).topk(batch, 4, 1.0, 3)
    local_ids, local = ModelScorer(policy).topk(batch, 4, 1.0, 3)
    on = batch.loss_mask.bool()
    assert torch.equal(remote_ids[on], local_ids[on])
    assert (remote[on] - local[on]).abs().max() < 1e-4
    assert (local[on][:, 0] >= local[on][:, 1]).all()  # likeliest first
