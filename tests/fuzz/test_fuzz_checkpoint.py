"""Random byte damage to a saved tiny run (two checkpoints): resuming finds the newest
intact checkpoint and loads it, or says in one line that none is left; never another
exception, never a damaged checkpoint loaded."""

import atexit
import contextlib
import functools
import io
import shutil
import tempfile
from pathlib import Path

import torch
from hypothesis import strategies as st

from ponder.config import LoraConfig
from ponder.models import apply_lora, load_policy
from ponder.models.adapters import load_adapter_weights, saved_weights
from ponder.train.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint

from .conftest import fuzz_pair, one_line_error


def _save_run(run: Path) -> None:
    torch.manual_seed(0)
    policy = apply_lora(load_policy("tiny", device="cpu"), LoraConfig(r=2, alpha=4))
    trainable = [p for p in policy.model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=0.1)
    for step in (1, 2):
        loss = sum((p * p).sum() for p in trainable) + sum(p.sum() for p in trainable)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        save_checkpoint(run, step, policy, {"optimizer": optimizer.state_dict(), "trainer": {"step": step}})


@functools.lru_cache(maxsize=None)
def saved_run() -> tuple[Path, torch.nn.Module]:
    """The intact run (made once, on first use: collection stays fast) and a model to load into."""
    run = Path(tempfile.mkdtemp(prefix="ponder-fuzz-run-"))
    atexit.register(shutil.rmtree, run, True)
    _save_run(run)
    return run, apply_lora(load_policy("tiny", device="cpu"), LoraConfig(r=2, alpha=4)).model


CHECKPOINT_FILES = ["adapter_config.json", "adapter_model.safetensors", "checksums.json", "optimizer.pt", "ponder.json",
                    "trainer.pt"]  # fmt: skip
# Every file a damage may hit: both checkpoints' files and the `latest` pointer.
TARGETS = ["checkpoints/latest"] + [f"checkpoints/step-00000{step}/{name}" for step in (1, 2) for name in CHECKPOINT_FILES]

DAMAGE = st.tuples(
    st.sampled_from(TARGETS),
    st.sampled_from(["flip", "truncate", "overwrite", "delete", "append", "empty", "replace"]),
    st.integers(0, 1 << 20),  # where (modulo the file's size)
    # Raw bytes, and bytes that turn an emptied file into valid JSON of the wrong shape.
    st.one_of(st.binary(min_size=1, max_size=64),
              st.sampled_from([b"[]", b"1", b'"x"', b"null", b"{}", b'{"trainer.pt": 5}', b'{"a\\nb": "0"}'])),
)


def damaged_copy(damages: list) -> Path:
    run = Path(tempfile.mkdtemp(prefix="ponder-fuzz-damaged-"))
    shutil.copytree(saved_run()[0], run, dirs_exist_ok=True)
    for target, kind, where, data in damages:
        path = run / target
        if not path.exists():
            continue
        content = bytearray(path.read_bytes())
        at = where % (len(content) + 1)
        if kind == "delete":
            path.unlink()
            continue
        if kind == "flip" and content:
            content[at % len(content)] ^= 1 << (where % 8)
        elif kind == "truncate":
            content = content[:at]
        elif kind == "overwrite":
            content[at : at + len(data)] = data
        elif kind == "append":
            content += data
        elif kind == "empty":
            content = bytearray()
        elif kind == "replace":
            content = bytearray(data)
        path.write_bytes(bytes(content))
    return run


def check_resume(damages: list) -> None:
    run = damaged_copy(damages)
    warnings = io.StringIO()
    try:
        with contextlib.redirect_stderr(warnings):
            found = latest_checkpoint(run)
        lines = warnings.getvalue().splitlines()
        assert len(lines) <= 1 and all(line.startswith("ponder: warning: ") for line in lines), lines
        if found is None:
            assert lines and lines[0].endswith("no intact checkpoint left"), lines
            return
        state = load_checkpoint(found)
        step = int(found.name.split("-")[1])
        assert state["trainer"] == {"step": step}
        intact, model = saved_run()
        reference = saved_weights(intact / "checkpoints" / found.name)
        assert all(torch.equal(reference[name], tensor) for name, tensor in saved_weights(found).items())
        load_adapter_weights(model, found)
    except ValueError as err:  # ponder's one-line errors are ValueErrors (CheckpointError, ModelLoadError)
        one_line_error(str(err))
    finally:
        shutil.rmtree(run, ignore_errors=True)


test_damaged_checkpoints, test_damaged_checkpoints_deep = fuzz_pair(
    st.lists(DAMAGE, min_size=1, max_size=3), check_resume, fast=60, deep=1000
)


def test_the_fuzzed_run_is_intact_and_every_file_is_a_target():
    run, _ = saved_run()
    assert sorted(str(p.relative_to(run)) for p in run.rglob("*") if p.is_file()) == sorted(TARGETS)
    assert latest_checkpoint(run).name == "step-000002"
    assert load_checkpoint(run / "checkpoints" / "step-000001")["trainer"] == {"step": 1}
