"""Layer-dropped students (ponder.models.students): which layers are kept, the kept
layers' weights carried over, all layers kept reproducing the teacher exactly, and the
written directory loading in transformers alone."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM

from ponder.models.students import drop_layers, layers_to_keep, write_student
from ponder.models.tiny import tiny_policy


def test_kept_layers_are_spread_first_and_last_included():
    assert layers_to_keep(30, 15) == [0, 2, 4, 6, 8, 10, 12, 15, 17, 19, 21, 23, 25, 27, 29]
    assert layers_to_keep(30, 2) == [0, 29] and layers_to_keep(4, 4) == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="--keep-layers 31: the model has 30 decoder layers"):
        layers_to_keep(30, 31)


def test_dropping_keeps_the_chosen_layers_weights_and_all_layers_is_the_teacher():
    teacher = tiny_policy(seed=1, num_layers=4).model.eval()
    ids = torch.tensor([[5, 9, 2, 7, 3]])
    same = drop_layers(teacher, [0, 1, 2, 3])
    assert torch.equal(same(ids).logits, teacher(ids).logits)
    small = drop_layers(teacher, [0, 3])
    assert small.config.num_hidden_layers == 2 and teacher.config.num_hidden_layers == 4
    assert torch.equal(small.model.layers[1].mlp.up_proj.weight, teacher.model.layers[3].mlp.up_proj.weight)
    assert [layer.self_attn.layer_idx for layer in small.model.layers] == [0, 1]
    out = small.generate(ids, max_new_tokens=3, do_sample=False)  # a KV cache of 2 layers works
    assert out.shape == (1, 8)


def test_the_written_student_loads_in_transformers(tmp_path):
    teacher = tiny_policy(seed=1, num_layers=4)
    source = tmp_path / "teacher"
    teacher.model.save_pretrained(source)
    teacher.tokenizer.save_pretrained(source)
    out, kept = write_student(str(source), 2, tmp_path / "student")
    loaded = AutoModelForCausalLM.from_pretrained(out)
    assert kept == [0, 3] and loaded.config.num_hidden_layers == 2
    ids = torch.tensor([[5, 9, 2]])
    assert torch.allclose(loaded(ids).logits, drop_layers(teacher.model, kept)(ids).logits, atol=1e-6)
    with pytest.raises(ValueError, match="exists and is not empty"):
        write_student(str(source), 2, tmp_path / "student")
    cli = subprocess.run([sys.executable, "-m", "ponder.cli", "export", str(source), "--keep-layers", "3",
                          "--out", str(tmp_path / "cli")], capture_output=True, text=True)  # fmt: skip
    assert cli.returncode == 0 and "3 decoder layers (0, 2, 3)" in cli.stdout, cli.stderr
