"""ponder from Python: load a recipe, train, evaluate, serve — no YAML, no command line.

    python examples/python_api.py OUT_DIR            # the embedded model, a few minutes
    python examples/python_api.py OUT_DIR --tiny     # a random tiny model, seconds (a smoke test)

Prints the held-out reward before and after training, then serves the trained model
on 127.0.0.1 for one chat request made with the `openai` client, and stops.
"""

from __future__ import annotations

import argparse
import threading
import time

from ponder.api import evaluate, load_recipe, serve, train

TINY = ["model.name=tiny", "sft.steps=2", "sft.batch_size=2", "sft.examples=4", "train.steps=2",
        "train.tasks_per_step=2", "rollout.group_size=2", "rollout.sampling.max_new_tokens_per_turn=8",
        "env.options.taskgen.n_people=20", "env.options.taskgen.n_train=8", "env.options.taskgen.n_eval=2", "lora.r=4",
        "eval.episodes=2"]  # fmt: skip
SMALL = ["sft.steps=8", "train.steps=2", "train.tasks_per_step=2", "rollout.group_size=4", "eval.episodes=8"]


def ask(port: int, model: str) -> str:
    """One chat request to the server on `port`, once it answers."""
    from openai import OpenAI

    client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
    for _ in range(600):
        try:
            reply = client.chat.completions.create(model=model, max_tokens=8,
                                                   messages=[{"role": "user", "content": "Say hi."}])  # fmt: skip
            return reply.choices[0].message.content or ""
        except Exception:  # not listening yet
            time.sleep(0.2)
    raise RuntimeError("the server never answered")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", help="run directory to write")
    parser.add_argument("--tiny", action="store_true", help="a random tiny model (a smoke test)")
    parser.add_argument("--port", type=int, default=8123)
    args = parser.parse_args()

    recipe = load_recipe("recipes/search_qa_grpo.yaml", TINY if args.tiny else SMALL)
    before = evaluate(recipe).metrics["reward"]
    run_dir = train(recipe, args.out, overwrite=True)
    after = evaluate(recipe, model=run_dir).metrics["reward"]
    print(f"held-out reward: {before:.3f} before, {after:.3f} after training ({run_dir})")

    server = threading.Thread(target=serve, args=(run_dir,), kwargs={"port": args.port}, daemon=True)
    server.start()  # a daemon thread: the server stops when this script ends
    print(f"served the trained model; it said: {ask(args.port, str(run_dir))!r}")


if __name__ == "__main__":
    main()
