"""Token sampling: `torch.multinomial` against ponder's inverse-CDF `draw_from`, side by
side in one run, on the embedded model's vocabulary size.

    python bench/sampling.py [--vocab 49152] [--batches 1,32,128] [--repeats 50]

Both draw one token per row from the same softmax rows with a seeded generator. Prints
milliseconds per call (best of 3 rounds of `--repeats` calls) and the ratio, and checks
that both samplers follow the same law (total variation between their empirical
distributions over a 5-token toy row, 200k draws each).
"""

from __future__ import annotations

import argparse
import time

import torch

from ponder.rollout.backend import draw_from


def per_call_ms(fn, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(3):
        tick = time.perf_counter()
        for _ in range(repeats):
            fn()
        best = min(best, (time.perf_counter() - tick) / repeats)
    return best * 1000


def law_distance(draws: int = 200_000) -> float:
    probs = torch.tensor([[0.05, 0.4, 0.0, 0.25, 0.3]]).expand(draws, 5).contiguous()
    generator = torch.Generator().manual_seed(0)
    ours = torch.bincount(draw_from(probs, generator), minlength=5).double() / draws
    theirs = torch.bincount(torch.multinomial(probs, 1, generator=generator).squeeze(-1), minlength=5).double() / draws
    return 0.5 * float((ours - theirs).abs().sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=49152, help="SmolLM2's vocabulary size")
    parser.add_argument("--batches", default="1,32,128")
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    generator = torch.Generator().manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, vocabulary {args.vocab}")
    print(f"{'batch':>6} {'multinomial ms':>15} {'draw_from ms':>13} {'ratio':>7}")
    for batch in (int(b) for b in args.batches.split(",")):
        probs = torch.softmax(torch.randn(batch, args.vocab, generator=generator) * 3, dim=-1)
        slow = per_call_ms(lambda: torch.multinomial(probs, 1, generator=generator), args.repeats)
        fast = per_call_ms(lambda: draw_from(probs, generator), args.repeats)
        print(f"{batch:>6} {slow:>15.2f} {fast:>13.2f} {slow / fast:>6.1f}x")
    print(f"total variation between the two samplers' draws on a toy row: {law_distance():.4f}")


if __name__ == "__main__":
    main()
