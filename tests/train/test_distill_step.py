"""On-policy distillation in the RL trainer (algo.distill_coef with a teacher): the
teacher scores the student's sampled tokens, the advantage is coef x (teacher −
student) on policy tokens, a teacher equal to the student gives no update, and a
teacher of another tokenizer is refused with one line."""

from __future__ import annotations

import pytest
import torch

from ponder.config import load_recipe
from ponder.jobs.parts import rl_trainer
from ponder.models.tiny import tiny_policy
from ponder.train.batch import collate
from ponder.train.teacher import Teacher
from ponder.train.update import forward_pass_no_grad

TINY = ["model.name=tiny", "train.tasks_per_step=2", "rollout.group_size=2", "rollout.batch_size=4",
        "rollout.sampling.max_new_tokens_per_turn=12", "env.max_turns=2", "lora.r=4", "train.steps=1",
        "env.options.taskgen.n_people=20", "env.options.taskgen.n_train=8", "env.options.taskgen.n_eval=2",
        "sft.steps=0", "algo.advantage=none", "algo.distill_coef=1.0", "teacher.model=tiny"]  # fmt: skip


def test_the_advantage_is_the_teachers_logprob_minus_the_students(tmp_path):
    trainer = rl_trainer(load_recipe(None, TINY), tmp_path, reward=lambda t, task: (0.0, {}))
    other = tiny_policy(seed=5)  # a teacher that differs from the student
    trainer.teacher = Teacher({"": lambda part, micro, temperature: forward_pass_no_grad(other, part, micro, 1.0)})
    tasks = trainer.sampler.next_batch(2)
    trajectories, _ = trainer.engine.run(tasks)
    batch = collate(trajectories, trainer.policy.tokenizer.pad_token_id)
    metrics = trainer._teacher_pass(batch, tasks)
    advantages, _ = trainer._advantages(batch)
    on = batch.loss_mask.bool()
    assert torch.allclose(advantages[on], (batch.teacher_logprobs - batch.old_logprobs)[on])
    assert (advantages[~on] == 0).all() and advantages[on].abs().sum() > 0
    assert metrics["distill/reverse_kl"] == pytest.approx((batch.old_logprobs - batch.teacher_logprobs)[on].mean().item())


def test_a_teacher_equal_to_the_student_moves_nothing(tmp_path):
    trainer = rl_trainer(load_recipe(None, TINY), tmp_path, reward=lambda t, task: (0.0, {}))
    metrics = trainer.train_step()  # the LoRA student starts as the base: the teacher
    assert abs(metrics["distill/reverse_kl"]) < 1e-4
    assert metrics["optim/grad_norm"] < 1e-4


def test_distillation_needs_a_teacher_and_a_shared_tokenizer(tmp_path):
    with pytest.raises(ValueError, match="algo.distill_coef .* and teacher.model come together"):
        rl_trainer(load_recipe(None, [o for o in TINY if not o.startswith("teacher")]), tmp_path)
    with pytest.raises(ValueError, match="teacher.model 'smollm2-135m': its tokenizer is not the student's"):
        rl_trainer(load_recipe(None, TINY[:-1] + ["teacher.model=smollm2-135m"]), tmp_path)


def test_one_teacher_per_task_kind():
    """Rows of a kind with its own teacher get that one's scores; others the every-kind
    teacher's; with no every-kind teacher, the rest keep the student's (advantage 0)."""
    from ponder.types import Trajectory

    rows = [Trajectory(f"t{i}", [1, 2], [3, 4, 5], [1, 1, 0], [-1.0, -1.0, 0.0]) for i in range(3)]
    batch = collate(rows, 0)

    def constant(value):
        return lambda part, micro, temperature: torch.full(part.old_logprobs.shape, value)

    by_kind = Teacher({"math": constant(-0.5), "": constant(-2.0)})
    scores = by_kind.token_logprobs(batch, ["math", "search_qa", "math"], 4, 1.0)
    on = batch.loss_mask.bool()
    assert scores[0][on[0]].tolist() == [-0.5, -0.5] and scores[1][on[1]].tolist() == [-2.0, -2.0]
    assert (scores[~on] == batch.old_logprobs[~on]).all()  # only policy tokens are scored
    only_math = Teacher({"math": constant(-0.5)}).token_logprobs(batch, ["math", "search_qa", "math"], 4, 1.0)
    assert torch.equal(only_math[1], batch.old_logprobs[1])


@pytest.mark.parametrize("loss", ["gkd", "topk"])
def test_gkd_and_topk_train_as_a_loss_term(tmp_path, loss):
    """teacher.loss gkd / topk: a loss term beside the policy loss. Its logged value is
    the loss over the policy tokens computed by hand from the student's and the
    teacher's next-token distributions, and it moves the weights."""
    from ponder.algos.distill import DISTILL_LOSSES, DistillConfig, TeacherScores
    from ponder.train.teacher import ModelScorer

    recipe = load_recipe(None, TINY + [f"teacher.loss={loss}", "teacher.top_k=5", "teacher.beta=0.3"])
    trainer = rl_trainer(recipe, tmp_path, reward=lambda t, task: (0.0, {}))
    other = ModelScorer(tiny_policy(seed=5))
    trainer.teacher = Teacher({"": other})
    tasks = trainer.sampler.next_batch(2)
    trajectories, _ = trainer.engine.run(tasks)
    batch = collate(trajectories, trainer.policy.tokenizer.pad_token_id)
    trainer._no_grad_passes(batch)
    trainer._teacher_pass(batch, tasks)
    advantages, returns = trainer._advantages(batch)
    assert (advantages == 0).all()  # advantage none: the distillation term is the whole signal

    keep = batch.loss_mask.bool().any(0).nonzero().squeeze(-1)
    student = ModelScorer(trainer.policy).logits(batch, keep, 1.0)
    if loss == "gkd":
        scores = TeacherScores(logits=other.logits(batch, keep, 1.0))
    else:
        scores = TeacherScores(topk_ids=batch.teacher_topk_ids[:, keep], topk_logprobs=batch.teacher_topk_logprobs[:, keep])
    mask = batch.loss_mask[:, keep]
    expected = DISTILL_LOSSES.get(loss)(student, scores, mask, DistillConfig(0.3, 1.0))[mask.bool()].mean().item()

    from ponder.train.update import optimise

    before = [p.detach().clone() for p in trainer._trainable()]
    update = optimise(trainer.update_inputs(), batch, advantages, returns)
    assert update["loss/distill"] == pytest.approx(expected, rel=1e-3)
    assert expected > 0 and update["optim/grad_norm"] > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer._trainable()))


def test_gkd_from_a_teacher_equal_to_the_student_is_zero(tmp_path):
    trainer = rl_trainer(load_recipe(None, TINY + ["teacher.loss=gkd"]), tmp_path, reward=lambda t, task: (0.0, {}))
    metrics = trainer.train_step()  # the LoRA student starts as the base: the teacher
    assert abs(metrics["loss/distill"]) < 1e-6 and metrics["optim/grad_norm"] < 1e-5


def test_bad_distillation_settings_are_refused(tmp_path):
    with pytest.raises(ValueError, match="teacher.loss: unknown 'jsd'; valid: opd, gkd, topk"):
        rl_trainer(load_recipe(None, TINY + ["teacher.loss=jsd"]), tmp_path)
    with pytest.raises(ValueError, match="teacher.top_k must be >= 1"):
        rl_trainer(load_recipe(None, TINY + ["teacher.loss=topk", "teacher.top_k=0"]), tmp_path)
    url = TINY[:-1] + ["teacher.model=http://127.0.0.1:9/v1", "teacher.loss=gkd"]
    with pytest.raises(ValueError, match="teacher.loss gkd reads the teacher's whole next-token distribution"):
        rl_trainer(load_recipe(None, url), tmp_path)
