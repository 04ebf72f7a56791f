"""Write one task set in three layouts, from ponder's own generated math word problems
(ponder.envs.math_tasks; never a public benchmark's data), for the data guide's recipes:

    python examples/data/write_files.py            # into runs/data/ (or --out DIR)

- gsm8k_style/{train,eval}.jsonl: GSM8K's layout, `question` and `answer` (the worked
  steps, then `#### 12`), plus the problem's `level` — recipes/verified_qa.yaml;
- verl/{train,eval}.parquet: verl's RL Parquet, as verl's GSM8K preprocessing writes
  it (`data_source`, `prompt` messages, `ability`, `reward_model: {style,
  ground_truth}`, `extra_info: {split, index, answer, question}`, plus `level`) —
  recipes/verified_qa_verl.yaml;
- trl/{train,eval}.parquet: TRL's conversational prompt-only layout (`prompt`
  messages, plus `answer`, `solution` and `level` columns for the reward function
  and the warm-up) — recipes/verified_qa_trl.yaml with examples/data/trl_reward.py.

The three hold the same problems, split the same way, opening with the same user
message, so the three recipes train the same task set.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ponder.data.export import write_rows
from ponder.envs.math_tasks import generate_problems, gsm8k_row
from ponder.envs.taskfile import write_jsonl

# verl's GSM8K preprocessing appends this to every question; the three layouts share it.
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
LEVELS = [1, 2]  # one and two operations: where the embedded model is right often enough for RL to learn


def gsm8k_splits(seed: int = 0, n_train: int = 512, n_eval: int = 128) -> dict[str, list[dict[str, Any]]]:
    """GSM8K-style rows {question, answer, level}; no question in both splits (eval drawn first)."""
    held_out = generate_problems(seed, n_eval, LEVELS, None)
    training = generate_problems(seed + 1_000_003, n_train, LEVELS, None, exclude={p.question for p in held_out})
    return {split: [{**gsm8k_row(p), "level": p.level} for p in problems]
            for split, problems in (("train", training), ("eval", held_out))}  # fmt: skip


def final_answer(row: dict[str, Any]) -> str:
    """The number after `####` in a GSM8K-style answer."""
    return row["answer"].rsplit("####", 1)[1].strip()


def verl_row(row: dict[str, Any], split: str, index: int) -> dict[str, Any]:
    """One row as verl's examples/data_preprocess/gsm8k.py lays it out."""
    return {
        "data_source": "ponder/math_word_problems",
        "prompt": [{"role": "user", "content": f"{row['question']} {INSTRUCTION}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": final_answer(row)},
        "extra_info": {"split": split, "index": index, "answer": row["answer"], "question": row["question"],
                       "level": row["level"]},
    }


def trl_row(row: dict[str, Any]) -> dict[str, Any]:
    """One row in TRL's conversational prompt-only layout, with the columns the reward reads."""
    return {"prompt": [{"role": "user", "content": f"{row['question']} {INSTRUCTION}"}],
            "answer": final_answer(row), "solution": row["answer"], "level": row["level"]}  # fmt: skip


def write_files(out: str | Path, seed: int = 0, n_train: int = 512, n_eval: int = 128) -> list[Path]:
    """Every file, written atomically; their paths."""
    root = Path(out)
    written = []
    for split, rows in gsm8k_splits(seed, n_train, n_eval).items():
        paths = (root / "gsm8k_style" / f"{split}.jsonl", root / "verl" / f"{split}.parquet",
                 root / "trl" / f"{split}.parquet")  # fmt: skip
        write_jsonl(paths[0], rows)
        write_rows([verl_row(row, split, index) for index, row in enumerate(rows)], paths[1])
        write_rows([trl_row(row) for row in rows], paths[2])
        written.extend(paths)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/data", help="the directory to write into (default runs/data)")
    parser.add_argument("--seed", type=int, default=0, help="the problem generator's seed (default 0)")
    parser.add_argument("--n-train", type=int, default=512, help="training problems (default 512)")
    parser.add_argument("--n-eval", type=int, default=128, help="held-out problems (default 128)")
    args = parser.parse_args()
    for path in write_files(args.out, args.seed, args.n_train, args.n_eval):
        print(path)


if __name__ == "__main__":
    main()
