"""What the training gateway costs: finished episodes per second of a native environment
against the same episodes driven by an agent program through the gateway (HTTP, the
real `openai` client, session recording), side by side in one run, on the same model,
prompts, batch and sampler, alternating round by round (medians over --rounds).

    .venv/bin/python bench/gateway_overhead.py --episodes 32 --batch 1 8 32 --rounds 3
    .venv/bin/python bench/gateway_overhead.py --smoke       # the tiny model, seconds

Both sides decode greedily from the same prompt ids (the prompt ponder serve renders for
the program's request), so they write the same tokens; the table shows each side's
generated-token count to prove it. The gateway's concurrency is the native side's batch
size. Prints a table; --out writes the numbers as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import openai  # noqa: E402

from ponder.config import RolloutConfig, SamplingConfig  # noqa: E402
from ponder.envs.gateway import GatewayOptions, ProgramDriven  # noqa: E402
from ponder.models import load_policy  # noqa: E402
from ponder.rollout.engine import RolloutEngine, build_engine  # noqa: E402
from ponder.rollout.hf import HFBackend  # noqa: E402
from ponder.serve.chat import plan_chat  # noqa: E402
from ponder.serve.protocol import ChatRequest  # noqa: E402
from ponder.types import Task  # noqa: E402



def messages_of(task: dict) -> list[dict]:
    return [{"role": "user", "content": task["question"]}]


async def program(task: dict, base_url: str, api_key: str) -> float:
    """The agent program: one chat call, as an OpenAI-SDK user writes it."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    await client.chat.completions.create(model="policy", messages=messages_of(task))
    return 1.0


class OneTurn:
    """The native side: the prompt ponder serve renders for the program's request, one action."""

    stop_strings: list[str] = []

    def reset(self, task: Task) -> list[dict]:
        request = ChatRequest(model="policy", messages=messages_of(task.to_dict()))
        return plan_chat(request).messages

    def step(self, action: str) -> tuple[None, bool, dict]:
        return None, True, {}


def rate(engine, tasks: list[Task]) -> tuple[float, int]:
    start = time.perf_counter()
    trajectories, _ = engine.run(tasks)
    seconds = time.perf_counter() - start
    return len(trajectories) / seconds, sum(sum(t.loss_mask) for t in trajectories)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="the tiny model, 4 episodes, one round")
    parser.add_argument("--out", help="write the numbers here as JSON")
    args = parser.parse_args(argv)
    if args.smoke:
        args.model, args.episodes, args.batch, args.rounds, args.tokens = "tiny", 4, [2], 1, 8
    policy = load_policy(args.model)
    sampling = SamplingConfig(temperature=0.0, max_new_tokens_per_turn=args.tokens, max_total_tokens=4096)
    backend = HFBackend(policy, sampling, seed=0)
    tasks = [Task(f"t{i}", f"Tell story number {i} about a lighthouse.", []) for i in range(args.episodes)]
    options = GatewayOptions(agent=f"{__name__}:program", tasks="unused")
    rows = []
    for batch in args.batch:
        native = RolloutEngine(backend, OneTurn, RolloutConfig(batch_size=batch, group_size=1, sampling=sampling))
        gateway = build_engine(backend, ProgramDriven(options, 600.0),
                               RolloutConfig(batch_size=batch, group_size=1, sampling=sampling))  # fmt: skip
        native_rates, gateway_rates, tokens = [], [], set()
        for _ in range(args.rounds):
            for side, rates in ((native, native_rates), (gateway, gateway_rates)):
                per_s, generated = rate(side, tasks)
                rates.append(per_s)
                tokens.add(generated)
        row = {"batch": batch, "native_episodes_per_s": statistics.median(native_rates),
               "gateway_episodes_per_s": statistics.median(gateway_rates), "generated_tokens": sorted(tokens)}
        row["ratio"] = row["gateway_episodes_per_s"] / row["native_episodes_per_s"]
        rows.append(row)
        print(f"batch {batch:>3}: native {row['native_episodes_per_s']:7.2f} episodes/s, gateway "
              f"{row['gateway_episodes_per_s']:7.2f} episodes/s, ratio {row['ratio']:.3f} "
              f"(tokens per side and round: {row['generated_tokens']})", flush=True)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"model": args.model, "episodes": args.episodes,
                                              "tokens": args.tokens, "rows": rows}, indent=2))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
