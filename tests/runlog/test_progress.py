"""Off a terminal (a log file, nohup, CI) progress is plain lines: the stage, count/total,
rate and ETA, throttled to one per 10 % of the work or per PLAIN_EVERY_S seconds."""

import io

from ponder.runlog.progress import PlainProgress, item_progress, training_progress


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_plain_lines_at_each_tenth_and_the_end_with_rate_and_eta():
    stream, clock = io.StringIO(), Clock()
    progress = PlainProgress("SFT steps", 200, stream, every_s=1e9, clock=clock)
    for _ in range(200):
        clock.now += 6.0  # a step every 6 s: a 20-minute warm-up
        progress.advance()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1 + 10  # the start, then each 10 %: never a line per step
    assert lines[0] == "SFT steps 0/200 (0%) · elapsed 0s"
    assert lines[1] == "SFT steps 20/200 (10%) · 6.0s each · elapsed 2m00s · ETA 18m00s"
    assert lines[-1] == "SFT steps 200/200 (100%) · 6.0s each · elapsed 20m00s"


def test_plain_lines_between_tenths_at_most_one_per_interval():
    stream, clock = io.StringIO(), Clock()
    progress = PlainProgress("episodes", 10_000, stream, every_s=60.0, clock=clock)
    for _ in range(300):  # 3 % of the work in 5 minutes, an item a second
        clock.now += 1.0
        progress.advance()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1 + 5  # one a minute
    assert lines[1] == "episodes 60/10000 (1%) · 1.00/s · elapsed 1m00s · ETA 2h45m"


def test_item_progress_off_a_terminal_prints_plain_lines(capsys):
    with item_progress("episodes", 4) as advance:
        for _ in range(4):
            advance(object())
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("episodes 0/4 (0%)")
    assert err[-1].startswith("episodes 4/4 (100%)")
    assert len(err) == 5  # a quarter each time: past a further 10 % every call


def test_training_progress_off_a_terminal_prints_every_step_with_count_and_eta(capsys):
    with training_progress(3, start=1) as on_step:
        on_step(2, {"reward/mean": 0.5})
        on_step(3, {"reward/mean": 0.75})
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("RL steps 1/3 (33%)")
    assert err[1].startswith("RL steps 2/3 (67%)") and "ETA" in err[1] and "reward +0.500" in err[1]
    assert err[2].startswith("RL steps 3/3 (100%)") and "reward +0.750" in err[2]
