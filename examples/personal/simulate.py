"""Simulated users with conflicting preferences teach their own adapters (issue 27's
"must show" for per-user adapters).

Three users (prefs.py): `one_line` wants the answer in one line, `unit_words` wants the
unit written out, `json` wants a JSON object with an "answer" key. They ask unit word
problems generated here (no downloads). In each round, every user not yet satisfied in
turn asks --batch training prompts; their current adapter answers greedily (the base while they
have none); a liked reply gets a thumbs-up, any other a thumbs-down and the user's
rewrite; `update_user` then trains that user's adapter by DPO on all their pairs so far
(reference = the base with adapters disabled: the KL anchor). After every update the
held-out prompts are answered greedily by the base and by every user's current model,
and every reply is scored by every user's checker, so the other users' rates are
tracked while one user trains. A user stops at --target or after --rounds rounds.

The base weights never train: their hash (models/base_hash.py) is taken before and
after, and on every copy an update trained on. With --general, the base's search-QA
and math evaluation (`ponder eval`, greedy) is run before the simulation on the model
as loaded and after it on the in-memory base with every adapter unloaded.

    python examples/personal/simulate.py --out runs/personal-sim             # the embedded model
    python examples/personal/simulate.py --model tiny --rounds 1 --out /tmp/sim   # plumbing only

Writes OUT/simulation.json (every measurement), OUT/table.md (printed too) and
OUT/satisfaction.png (report.py); OUT/store is the users' adapter store.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import math
import random
import shutil
import sys
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))

import prefs  # noqa: E402  (beside this script)
import report  # noqa: E402

# The base's general evaluation: each recipe and its score (search-QA: exact match; math: correct).
GENERAL_RECIPES = {"recipes/demo.yaml": "em", "recipes/math.yaml": "correct"}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    add = parser.add_argument
    add("--model", default="smollm2-135m", help="base model: smollm2-135m (default) or tiny (plumbing check)")
    add("--device", default="auto", help="auto, cpu or cuda")
    add("--dtype", default="float32", help="float32 (default), bfloat16, float16")
    add("--out", default="runs/personal-sim", help="output directory (its store/ is replaced)")
    add("--users", default="one_line,unit_words,json", help="comma-separated: " + ", ".join(prefs.USERS))
    add("--rounds", type=int, default=4, help="feedback rounds per user at most (the budget)")
    add("--batch", type=int, default=8, help="training prompts a user asks per round")
    add("--heldout", type=int, default=24, help="held-out prompts every rate is measured on")
    add("--target", type=float, default=0.9, help="a user stops once their held-out rate reaches this")
    add("--max-new-tokens", type=int, default=48, help="reply length cap (greedy)")
    add("--seed", type=int, default=0, help="prompts, each user's prompt order, the LoRA initialisation")
    add("--steps", type=int, default=12, help="DPO steps per update")
    add("--dpo-batch", type=int, default=4, help="preference pairs per DPO step")
    add("--micro-batch", type=int, default=4, help="pairs per forward pass (memory only)")
    add("--lr", type=float, default=1e-3, help="peak learning rate of an update")
    add("--beta", type=float, default=0.1, help="DPO beta: the strength of the KL anchor to the base")
    add("--rpo-alpha", type=float, default=0.0,
        help="weight of the rewritten reply's per-token NLL added to DPO's loss (RPO); 0 = plain DPO, as the "
             "runs before 2026-11-27 (PersonalConfig's default is 1)")
    add("--lora-r", type=int, default=8, help="LoRA rank of a user's adapter (alpha = 2r)")
    add("--general", action="store_true", help="also `ponder eval` the base (search-QA, math) before, after")
    add("--general-episodes", type=int, default=32, help="held-out tasks per general evaluation")
    args = parser.parse_args(argv)
    args.users = [name.strip() for name in args.users.split(",") if name.strip()]
    unknown = [name for name in args.users if name not in prefs.USERS]
    if unknown or not args.users:
        parser.error(f"--users: unknown {unknown}; use some of {', '.join(prefs.USERS)}")
    if min(args.rounds, args.batch, args.heldout, args.max_new_tokens) < 1:
        parser.error("--rounds, --batch, --heldout and --max-new-tokens must be >= 1")
    return args


def personal_config(args: argparse.Namespace) -> Any:
    from ponder.personal.config import PersonalConfig

    return PersonalConfig(steps=args.steps, batch_size=args.dpo_batch, micro_batch_size=args.micro_batch,
                          lr=args.lr, beta=args.beta, rpo_alpha=args.rpo_alpha, lora_r=args.lora_r,
                          lora_alpha=2 * args.lora_r,
                          seed=args.seed)  # fmt: skip


class Replier:
    """One base model with each user's current adapter loaded under its own name, as
    `ponder serve --users` holds them (serve/adapters.py's AdapterBackend): greedy replies
    from the base or from one user's adapter, rendered as the server renders a chat."""

    def __init__(self, policy: Any, max_new_tokens: int, n_users: int) -> None:
        from ponder.serve.adapters import AdapterBackend

        self.backend = AdapterBackend(policy, seed=0, cached_samplers=n_users + 1)
        self.max_new_tokens = max_new_tokens
        self.loaded: dict[str, str] = {}  # user -> PEFT adapter name of their current version

    def install(self, user: str, version: int, path: Path) -> None:
        """Load `user`'s new version and drop the one it replaces."""
        from ponder.serve.users import peft_name

        name = peft_name(user, version)
        self.backend.add_adapter(name, path)
        if user in self.loaded:
            self.backend.remove_adapter(self.loaded[user])
        self.loaded[user] = name

    def replies(self, user: str | None, tasks: list[prefs.UnitTask]) -> list[str]:
        """Greedy replies of `user`'s current model (None or a user without an adapter: the base)."""
        from ponder.rollout.backend import GenerationRequest

        tokenizer = self.backend.tokenizer
        requests = []
        for task in tasks:
            text = tokenizer.apply_chat_template(task.messages(), tokenize=False, add_generation_prompt=True)
            prompt = tokenizer.encode(text, add_special_tokens=False)
            requests.append(GenerationRequest(task.id, prompt, self.max_new_tokens))
        self.backend.adapter = self.loaded.get(user) if user is not None else None
        return [generation.text for generation in self.backend.generate(requests, [])]


def measure(replier: Replier, users: list[str], heldout: list[prefs.UnitTask]) -> dict[str, Any]:
    """Held-out replies of the base and of every user's current model, each scored by every
    user's checker: scores[model][checker] = {rate, se, n}; a digest of each model's replies
    (the same digest: the same replies) and a few of them as samples."""
    replies = {"base": replier.replies(None, heldout)}
    for user in users:
        replies[user] = replier.replies(user, heldout) if user in replier.loaded else replies["base"]
    scores, digests, samples = {}, {}, {}
    for model, texts in replies.items():
        scores[model] = {checker: prefs.rate([prefs.USERS[checker].likes(reply, task)
                                              for reply, task in zip(texts, heldout)]) for checker in users}
        digests[model] = hashlib.sha256(json.dumps(texts).encode()).hexdigest()[:16]
        samples[model] = texts[:3]
    return {"scores": scores, "reply_digests": digests, "samples": samples}


def give_feedback(store: Any, replier: Replier, user: str, tasks: list[prefs.UnitTask]) -> dict[str, int]:
    """`user` asks `tasks`; each reply is logged with a thumbs-up, or a thumbs-down and the rewrite."""
    sim = prefs.USERS[user]
    current = store.current(user)
    counts: Counter = Counter()
    for task, reply in zip(tasks, replier.replies(user, tasks)):
        chat = store.log_interaction(user, task.messages(), reply, current.version if current else None)
        if sim.likes(reply, task):
            store.add_feedback(chat, "up")
            counts["up"] += 1
        else:
            store.add_feedback(chat, "down")
            store.add_feedback(chat, "rewrite", text=sim.rewrite(task))
            counts["rewrite"] += 1
    return dict(counts)


def pair_count(store: Any, user: str) -> int:
    """The preference pairs `user`'s feedback so far gives (what an update trains on)."""
    from ponder.personal.feedback import preference_pairs

    return len(preference_pairs(*store.feedback_for(user))[0])


def adapter_digests(store: Any, users: list[str]) -> dict[str, str | None]:
    """sha256 of each user's current adapter weights (None: no adapter yet)."""
    digests: dict[str, str | None] = {}
    for user in users:
        current = store.current(user)
        path = current.path / "adapter_model.safetensors" if current else None
        digests[user] = hashlib.sha256(path.read_bytes()).hexdigest() if path else None
    return digests


class Simulation:
    """The rounds (see module docstring); `history` holds one point per measurement."""

    def __init__(self, args: argparse.Namespace, replier: Replier, store: Any, base_hash: str,
                 tasks: tuple[list[prefs.UnitTask], list[prefs.UnitTask]]) -> None:  # fmt: skip
        self.args, self.replier, self.store, self.base_hash = args, replier, store, base_hash
        self.train, self.heldout = tasks
        self.cfg = personal_config(args)
        # each user asks the shared training prompts in an order of their own
        self.orders = {user: random.Random(f"{args.seed}-{user}").sample(self.train, len(self.train))
                       for user in args.users}  # fmt: skip
        self.interactions = {user: 0 for user in args.users}
        self.history: list[dict[str, Any]] = []

    def point(self, round_: int, trained: str | None, **extra: Any) -> dict[str, Any]:
        started = time.monotonic()
        measured = measure(self.replier, self.args.users, self.heldout)
        point = {"index": len(self.history), "round": round_, "trained": trained,
                 "interactions": dict(self.interactions), **extra, **measured,
                 "measure_seconds": round(time.monotonic() - started, 2)}  # fmt: skip
        self.history.append(point)
        return point

    def own(self, point: dict[str, Any], user: str) -> float:
        return point["scores"][user][user]["rate"]

    def update(self, user: str) -> dict[str, Any]:
        """Train `user`'s next version on a fresh copy of the base; check that copy's base
        weights and the version's recorded base are the base measured from."""
        from ponder.models.base_hash import base_model_hash
        from ponder.models.loading import load_policy
        from ponder.personal.learn import update_user

        if pair_count(self.store, user) == 0:
            return {"skipped": "no preference pairs yet (every reply so far was liked)"}
        policy = load_policy(self.args.model, self.args.dtype, self.args.device)
        version, metrics = update_user(self.store, user, policy, self.cfg)
        hashes = (base_model_hash(policy.model), self.store.current(user).base_hash)
        del policy
        gc.collect()
        if hashes != (self.base_hash, self.base_hash):
            raise RuntimeError(f"user {user} v{version}: base weights changed ({hashes}, {self.base_hash})")
        self.replier.install(user, version, self.store.adapter_path(user, base_hash=self.base_hash))
        return metrics

    def user_round(self, user: str, round_: int) -> dict[str, Any]:
        """One round of `user`: feedback on --batch training prompts, an update, a measurement."""
        batch = self.args.batch
        tasks = self.orders[user][(round_ - 1) * batch : round_ * batch]
        started = time.monotonic()
        feedback = give_feedback(self.store, self.replier, user, tasks)
        self.interactions[user] += len(tasks)
        others = [other for other in self.args.users if other != user]
        before = adapter_digests(self.store, others)
        update = self.update(user)
        return self.point(round_, user, feedback=feedback, update=update, pairs=pair_count(self.store, user),
                          other_adapters_unchanged=adapter_digests(self.store, others) == before,
                          round_seconds=round(time.monotonic() - started, 2))  # fmt: skip

    def run(self, say: Any) -> None:
        from rich.console import Console
        from rich.progress import Progress

        start = self.point(0, None)
        active = [user for user in self.args.users if self.own(start, user) < self.args.target]
        say(report.point_line(start, self.args.users))
        with Progress(console=Console(stderr=True, soft_wrap=True), transient=True) as progress:
            bar = progress.add_task("user rounds", total=len(active) * self.args.rounds)
            for round_ in range(1, self.args.rounds + 1):
                for user in list(active):
                    point = self.user_round(user, round_)
                    progress.console.print(report.point_line(point, self.args.users), highlight=False)
                    progress.advance(bar)
                    if self.own(point, user) >= self.args.target:
                        active.remove(user)
                        progress.advance(bar, self.args.rounds - round_)
                if not active:
                    break


def general_eval(model: str, label: str, episodes: int, out: Path) -> dict[str, Any]:
    """`ponder eval` (greedy, one episode per task) of `model` on each general recipe;
    the score (search-QA: em, math: correct) with its standard error, and a digest of
    every episode's response tokens (the same digest: the same answers)."""
    import subprocess

    import pyarrow.parquet as pq

    results = {}
    for recipe, key in GENERAL_RECIPES.items():
        name = Path(recipe).stem
        run_dir = out / "general" / f"{label}-{name}"
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "ponder.cli", "eval", "--recipe", str(REPO / recipe),
                   "--model", model, "--episodes", str(episodes), "--out", str(run_dir), "--overwrite",
                   "eval.temperature=0"]  # fmt: skip
        with open(out / "general" / f"{label}-{name}.log", "w") as log:
            subprocess.run(command, check=True, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
        metrics = json.loads((run_dir / "metrics.json").read_text())
        value = metrics.get(key) if metrics.get(key) is not None else metrics["components"][key]
        value, n = float(value), int(metrics.get("episodes", episodes))
        answers = pq.read_table(run_dir / "trajectories.parquet", columns=["task_id", "response_ids"])
        digest = hashlib.sha256(json.dumps(answers.to_pylist()).encode()).hexdigest()[:16]
        se = math.sqrt(value * (1 - value) / max(1, n))
        results[name] = {"metric": key, "rate": value, "se": se, "n": n, "reward": metrics.get("reward"),
                         "reward_se": metrics.get("reward_se"), "responses_digest": digest,
                         "command": "ponder " + " ".join(command[3:])}  # fmt: skip
    return results


def unloaded_base(replier: Replier, directory: Path) -> Path:
    """The replier's base with every adapter removed (not merged), saved to `directory`."""
    from ponder.models.adapters import is_lora

    model = replier.backend.policy.model
    base = model.unload() if is_lora(model) else model
    base.save_pretrained(directory, safe_serialization=True)
    replier.backend.tokenizer.save_pretrained(directory)
    return directory


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console

    from ponder.models.base_hash import base_model_hash
    from ponder.models.loading import load_policy
    from ponder.personal.store import AdapterStore

    args = parse_args(argv)
    warnings.filterwarnings("ignore", category=FutureWarning)  # transformers' deprecations, once per update
    console = Console(stderr=True, soft_wrap=True)
    out = Path(args.out).resolve()
    shutil.rmtree(out / "store", ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    tasks = prefs.split_tasks(args.rounds * args.batch, args.heldout, args.seed)
    started = time.monotonic()
    general = {}
    if args.general:
        general["before"] = general_eval(args.model, "before", args.general_episodes, out)
    policy = load_policy(args.model, args.dtype, args.device)
    base_hash = base_model_hash(policy.model)
    replier = Replier(policy, args.max_new_tokens, len(args.users))
    sim = Simulation(args, replier, AdapterStore(out / "store"), base_hash, tasks)
    console.print(f"[bold]{len(args.users)} users[/] on {args.model}: {len(tasks[0])} training prompts, "
                  f"{len(tasks[1])} held out, up to {args.rounds} rounds of {args.batch}")  # fmt: skip
    sim_started = time.monotonic()
    sim.run(lambda line: console.print(line, highlight=False))
    sim_seconds = round(time.monotonic() - sim_started, 1)
    hash_after = base_model_hash(replier.backend.policy.model)
    if args.general:
        import tempfile

        with tempfile.TemporaryDirectory(prefix="ponder-base-after-", dir=out) as saved:
            general["after"] = general_eval(str(unloaded_base(replier, Path(saved))), "after",
                                            args.general_episodes, out)  # fmt: skip
    result = report.summarise(args, sim.history, tasks, {"before": base_hash, "after": hash_after}, general)
    result["seconds"], result["simulation_seconds"] = round(time.monotonic() - started, 1), sim_seconds
    report.write(result, out)
    print(report.table(result))
    console.print(f"wrote {out / 'simulation.json'}, {out / 'table.md'} and {out / 'satisfaction.png'} "
                  f"({result['seconds']:.0f} s)")  # fmt: skip
    return 0 if hash_after == base_hash else 1


if __name__ == "__main__":
    sys.exit(main())
