"""Teacher-forced turn accuracy and a task-family sequence on the tiny model."""

import torch

from ponder.config import ContinualConfig, LoraConfig, SFTTrainerConfig
from ponder.data import ChatFormatter, Conversation, TokenizedExample
from ponder.models import apply_lora, tiny_policy
from ponder.models.loading import Policy
from ponder.jobs.sequence import Family, teacher_forced_accuracy, train_sequence, turn_spans


def test_turn_spans_are_the_runs_of_ones():
    assert turn_spans([0, 1, 1, 0, 0, 1, 0, 1]) == [(1, 3), (5, 6), (7, 8)]
    assert turn_spans([0, 0]) == []


class _Echo(torch.nn.Module):
    """Predicts token t+1 = token t: argmax logits at t is input_ids[t]."""

    def forward(self, input_ids, attention_mask=None, **_):
        logits = torch.nn.functional.one_hot(input_ids, 8).float()
        return type("Out", (), {"logits": logits})()


def test_teacher_forced_accuracy_by_hand():
    policy = Policy(_Echo(), type("Tok", (), {"pad_token_id": 0})(), "echo", torch.device("cpu"))
    # turn 1 = tokens at 2..3 (targets 5, 5 after a 5): both predicted; turn 2 = 5..6 (3 after 5, then 3): one of two.
    example = TokenizedExample([1, 5, 5, 5, 5, 3, 3], [0, 0, 1, 1, 0, 1, 1])
    scores = teacher_forced_accuracy(policy, [example])
    assert scores == {"turn_accuracy": 0.5, "token_accuracy": 0.75}


def test_family_sequence_fills_the_accuracy_matrix(tmp_path):
    policy = apply_lora(tiny_policy(), LoraConfig(r=4, alpha=8))
    formatter = ChatFormatter(policy.tokenizer, "hermes")

    def family(name, answer):
        example = formatter(
            Conversation([{"role": "user", "content": name}, {"role": "assistant", "content": answer}])
        )
        return Family(name, [example] * 2, [example])

    families = [family("a", "yes"), family("b", "no"), family("c", "maybe")]
    sft = SFTTrainerConfig(steps=2, batch_size=2, micro_batch_size=2, lr=1e-2)
    result = train_sequence(policy, families, sft, ContinualConfig(replay_capacity=2, ewc_lambda=1.0, fisher_examples=1),
                            tmp_path, say=lambda _: None)  # fmt: skip
    assert len(result.accuracy) == 3 and all(len(row) == 3 for row in result.accuracy)
    assert len(result.baseline) == 3 and len(result.history) == 6
    assert result.history[-1]["sft/replayed"] == 1.0 and result.history[-1]["sft/ewc_penalty"] >= 0.0
