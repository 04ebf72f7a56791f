"""The decode thread count under CPU contention (ponder.models.cpu_threads)."""

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
import torch

from ponder.jobs.parts import rl_trainer
from ponder.models.cpu_threads import (
    WINDOW_S, CpuSnapshot, Decisions, step_threads, others_busy, read_snapshot, threads_for, torch_threads,
)  # fmt: skip


@pytest.mark.parametrize(
    ("others", "own", "cores", "expected"),
    [
        (0.0, 2, 2, 2),  # idle machine: keep both
        (0.4, 2, 2, 2),  # a little background work: 1.6 free rounds to two
        (1.0, 2, 2, 1),  # one other busy process: one core left
        (5.0, 2, 2, 1),  # heavily loaded: never below one thread
        (0.0, 4, 8, 4),  # a big machine with room to spare: never above torch's count
        (6.0, 4, 8, 2),  # six cores taken by others: two left
        (0.6, 2, 2, 1),  # 0.6 of a core taken rounds to one left
    ],
)
def test_threads_follow_what_the_others_use(others, own, cores, expected):
    assert threads_for(others, own, cores) == expected


def test_others_busy_hand_computed():
    # over 2 s the cores were busy 3.0 CPU-seconds, 1.0 of them this process's: the
    # others kept one core busy
    assert others_busy(CpuSnapshot(10.0, 100.0, 5.0), CpuSnapshot(12.0, 103.0, 6.0)) == pytest.approx(1.0)
    # this process's own work is never counted as the others', and never below 0
    assert others_busy(CpuSnapshot(0.0, 0.0, 0.0), CpuSnapshot(1.0, 2.0, 2.0)) == 0.0
    assert others_busy(CpuSnapshot(0.0, 0.0, 0.0), CpuSnapshot(1.0, 1.0, 1.5)) == 0.0
    # invariant to where the counters start
    shift = CpuSnapshot(1e6, 5e5, 300.0)
    a, b = CpuSnapshot(1.0, 2.0, 0.5), CpuSnapshot(3.0, 5.0, 1.0)
    moved = [CpuSnapshot(s.wall + shift.wall, s.busy + shift.busy, s.own + shift.own) for s in (a, b)]
    assert others_busy(*moved) == pytest.approx(others_busy(a, b)) == pytest.approx(1.25)


def test_read_snapshot_counts_busy_ticks_of_the_allowed_cores_only(tmp_path):
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal (guest columns after)
    stat.write_text("cpu  900 0 300 5000 10 0 0 0 0 0\n"
                    "cpu0 100 10 50 2000 5 1 2 3 0 0\n"
                    "cpu1 800 0 250 3000 5 0 0 0 0 0\n"
                    "intr 12345\n")  # fmt: skip
    ticks = os.sysconf("SC_CLK_TCK")
    assert read_snapshot({0}, str(stat)).busy == pytest.approx(166 / ticks)
    assert read_snapshot({0, 1}, str(stat)).busy == pytest.approx((166 + 1050) / ticks)
    assert read_snapshot({0}, str(tmp_path / "none")) is None


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="needs /proc/stat (Linux)")
def test_two_busy_processes_read_as_the_others_not_as_this_process():
    spin = "import multiprocessing as m\ndef s():\n    while True: pass\nm.Process(target=s, daemon=True).start()\ns()"
    load = subprocess.Popen([sys.executable, "-c", spin], start_new_session=True)
    try:
        time.sleep(0.5)
        cores = os.sched_getaffinity(0)
        before = read_snapshot(cores)
        sum(i * i for i in range(2_000_000))  # this process's own work in the interval
        time.sleep(1.0)
        after = read_snapshot(cores)
    finally:
        os.killpg(load.pid, 9)
        load.wait()
    assert after.own - before.own > 0.05
    # the two spinners hold nearly two cores (of however many there are), this process none of them
    assert others_busy(before, after) > (1.5 if len(cores) >= 2 else 0.8)


TWO_CORES = pytest.mark.skipif(not os.path.exists("/proc/stat") or len(os.sched_getaffinity(0)) < 2,
                               reason="needs /proc/stat and two cores")  # fmt: skip


@contextlib.contextmanager
def two_spinners() -> Iterator[set[int]]:
    """Two busy processes (a session of their own) on this process's first two cores,
    which it yields; killed on exit."""
    two = set(sorted(os.sched_getaffinity(0))[:2])
    spin = (f"import multiprocessing as m, os\nos.sched_setaffinity(0, {two})\n"
            "def s():\n    while True: pass\nm.Process(target=s, daemon=True).start()\ns()")  # fmt: skip
    load = subprocess.Popen([sys.executable, "-c", spin], start_new_session=True)
    try:
        time.sleep(0.5)
        yield two
    finally:
        os.killpg(load.pid, 9)
        load.wait()


@TWO_CORES
def test_a_decision_beside_two_busy_processes_takes_one_thread():
    with two_spinners() as two:
        decisions = Decisions()
        assert decisions.choose(2, two) == 1  # a fresh 0.1 s window: the two cores are taken
        first = decisions.snapshot
        assert decisions.choose(2, two) == 1 and decisions.snapshot is first  # reused, not measured
        assert decisions.choose(1, two) == 1


def scripted(monkeypatch, *snapshots: CpuSnapshot) -> list[float]:
    """read_snapshot returns `snapshots` in turn; returns the list of sleeps taken."""
    from ponder.models import cpu_threads

    queue, sleeps = list(snapshots), []
    monkeypatch.setattr(cpu_threads, "read_snapshot", lambda cores: queue.pop(0))
    monkeypatch.setattr(cpu_threads.time, "sleep", sleeps.append)
    return sleeps


def test_a_block_decides_the_next_and_a_long_interval_is_not_decided_from(monkeypatch):
    # (wall, busy, own) in seconds on two cores
    sleeps = scripted(
        monkeypatch,
        CpuSnapshot(0.0, 0.0, 0.0), CpuSnapshot(0.1, 0.0, 0.0),  # first decision: a fresh window, idle
        CpuSnapshot(0.1, 0.0, 0.0),  # block 1 ends at once: too short to measure
        CpuSnapshot(2.1, 4.0, 2.0),  # block 1 ends: 2 s, the others held one core
        CpuSnapshot(2.3, 4.1, 2.1),  # block 2 starts 0.2 s later: the block's measurement reused
        CpuSnapshot(12.3, 24.1, 2.1),  # block 3 starts 10 s later (others on both cores meanwhile)
        CpuSnapshot(13.3, 25.1, 3.1),  # block 3 ends: the others used nothing during it
    )  # fmt: skip
    decisions = Decisions()
    assert decisions.choose(2, {0, 1}) == 2 and sleeps == [WINDOW_S]
    decisions.finish(2, {0, 1})
    assert decisions.threads == 2
    decisions.finish(2, {0, 1})
    assert decisions.threads == 1
    assert decisions.choose(2, {0, 1}) == 1
    assert decisions.choose(2, {0, 1}) == 1 and decisions.snapshot.wall == 12.3  # kept, not decided
    decisions.finish(2, {0, 1})
    assert decisions.threads == 2 and sleeps == [WINDOW_S]  # only the first decision slept


@TWO_CORES
def test_a_block_beside_two_busy_processes_sets_the_next_to_one_thread():
    decisions = Decisions()
    decisions.choose(2, {0, 1})
    with two_spinners() as two:
        time.sleep(0.6)
        decisions.finish(2, two)
        assert decisions.threads == 1
        assert decisions.choose(2, two) == 1  # right after the block: its measurement, reused


def test_cpu_block_measures_only_when_the_count_is_chosen(monkeypatch):
    from ponder.models import cpu_threads

    finished: list[int] = []
    monkeypatch.setattr(cpu_threads._DECISIONS, "finish", lambda own, cores: finished.append(own))
    monkeypatch.setenv("PONDER_CPU_THREADS", "1")
    with cpu_threads.cpu_block():
        assert torch.get_num_threads() == 1
    assert finished == []
    monkeypatch.setenv("PONDER_CPU_THREADS", "auto")
    before = torch.get_num_threads()
    with cpu_threads.cpu_block():
        pass
    assert finished == [before] and torch.get_num_threads() == before


def test_forced_count_and_bad_values(monkeypatch):
    monkeypatch.setenv("PONDER_CPU_THREADS", "3")
    assert step_threads() == 3
    monkeypatch.setenv("PONDER_CPU_THREADS", "zero")
    with pytest.raises(ValueError, match="PONDER_CPU_THREADS='zero'"):
        step_threads()
    monkeypatch.setenv("PONDER_CPU_THREADS", "auto")
    assert 1 <= step_threads() <= torch.get_num_threads()


def test_torch_threads_restores_the_count():
    before = torch.get_num_threads()
    with torch_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before


def test_torch_threads_sets_the_count_even_when_torch_reports_it(monkeypatch):
    # OpenMP's team size is per thread: a thread that did not set it may compute on one
    # thread while torch reports two, so the block sets it in its own thread every time
    calls: list[int] = []
    real = torch.set_num_threads
    monkeypatch.setattr(torch, "set_num_threads", lambda n: (calls.append(n), real(n)))
    current = torch.get_num_threads()
    with torch_threads(current):
        pass
    assert calls == [current, current]


def test_training_passes_run_at_the_chosen_count(monkeypatch):
    """The RL update, its no-grad passes and the SFT step each run their forward (and
    backward) at the count step_threads chooses, and give torch its own count back."""
    from ponder.config import SFTConfig, load_recipe
    from ponder.train.batch import collate
    from ponder.train.sft import sft_train
    from ponder.train.update import forward_pass_no_grad, optimise

    overrides = ["model.name=tiny", "train.tasks_per_step=2", "rollout.group_size=2", "rollout.batch_size=4",
                 "rollout.sampling.max_new_tokens_per_turn=8", "env.max_turns=1", "env.options.taskgen.n_people=20",
                 "env.options.taskgen.n_train=8", "env.options.taskgen.n_eval=2", "lora.r=4"]  # fmt: skip
    trainer = rl_trainer(load_recipe(None, overrides), "unused", reward=lambda t, task: (1.0, {}))
    trajectories, _ = trainer.engine.run(trainer.sampler.next_batch(2))
    batch = collate(trajectories, trainer.policy.tokenizer.pad_token_id)
    seen: list[int] = []
    trainer.policy.model.register_forward_hook(lambda *_: seen.append(torch.get_num_threads()))
    before = torch.get_num_threads()
    monkeypatch.setenv("PONDER_CPU_THREADS", str(before + 1))  # a count no pass would take by itself
    forward_pass_no_grad(trainer.policy, batch, 2, 1.0)
    advantages = torch.ones_like(batch.loss_mask)
    optimise(trainer.update_inputs(), batch, advantages * batch.loss_mask, torch.zeros_like(advantages))
    sft_train(trainer.policy, trajectories, SFTConfig(steps=1, batch_size=2), micro_batch_size=1)
    assert len(seen) == 2 + 4 + 2 and set(seen) == {before + 1}
    assert torch.get_num_threads() == before
