"""The few tinker_cookbook (0.6.1) helpers that sl_loop.py and rl_loop.py use, written
again over the `tinker` client alone, and the local data that replaces their hub
datasets (no network here: the problems come from ponder's own math generator).

    cookbook 0.6.1                                here
    tokenizer_utils.get_tokenizer(model_name)     training_client.get_tokenizer() (the server's copy)
    renderers.get_renderer(...)                   ChatTemplateRenderer: the tokenizer's chat template
    supervised.data.conversation_to_datum         conversation_to_datum (same shift and "mean" weights)
    supervised.common.compute_mean_nll            compute_mean_nll (same formula)
    checkpoint_utils.save_checkpoint / get_last   save_checkpoint / get_last_checkpoint (checkpoints.jsonl)
    utils.ml_log.setup_logging                    MetricsLog (metrics.jsonl and one line per step)
    datasets.load_dataset("HuggingFaceH4/no_robots")  math_conversations (ponder's generated problems)
    datasets.load_dataset("openai/gsm8k", "main")     math_questions ("#### N" answers, as GSM8K's)
    math_grading.extract_boxed / grade_answer      extract_boxed / grade_answer (integers)
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
import time
import typing
from pathlib import Path
from typing import Any

import tinker
import torch

from ponder.envs.math_tasks import generate_problems

QUESTION_SUFFIX = " Provide a numerical answer without units, written inside \\boxed{}."


def parse_config(config_class: type, argv: list[str]) -> Any:
    """`key=value` arguments into the dataclass, as the cookbook's chz entry point takes them."""
    hints = typing.get_type_hints(config_class)
    values: dict[str, Any] = {}
    for arg in argv:
        key, sep, raw = arg.partition("=")
        if not sep or key not in hints:
            raise SystemExit(f"{arg!r}: give key=value with key one of {', '.join(hints)}")
        kinds = [t for t in typing.get_args(hints[key]) if t is not type(None)] or [hints[key]]
        if raw.lower() == "none":
            values[key] = None
        elif kinds[0] is bool:
            values[key] = raw.lower() in ("1", "true", "yes")
        else:
            values[key] = kinds[0](raw)
    return config_class(**values)


class ChatTemplateRenderer:
    """The renderer calls the loops make, on the tokenizer's own chat template."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def build_generation_prompt(self, messages: list[dict[str, str]]) -> tinker.ModelInput:
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return tinker.ModelInput.from_ints(self.tokenizer.encode(text, add_special_tokens=False))

    def build_supervised_example(self, messages: list[dict[str, str]]) -> tuple[tinker.ModelInput, torch.Tensor]:
        """The conversation's tokens and weights: 1 on the last assistant reply and its
        end-of-turn token (the cookbook's TrainOnWhat.LAST_ASSISTANT_MESSAGE)."""
        prompt = self.build_generation_prompt(messages[:-1]).to_ints()
        reply = self.tokenizer.encode(messages[-1]["content"], add_special_tokens=False) + [self.tokenizer.eos_token_id]
        weights = torch.tensor([0.0] * len(prompt) + [1.0] * len(reply))
        return tinker.ModelInput.from_ints(prompt + reply), weights

    def get_stop_sequences(self) -> list[int]:
        return [self.tokenizer.eos_token_id]

    def parse_response(self, tokens: list[int]) -> tuple[dict[str, str], bool]:
        ended = bool(tokens) and tokens[-1] == self.tokenizer.eos_token_id
        return {"role": "assistant", "content": self.tokenizer.decode(tokens, skip_special_tokens=True)}, ended


def conversation_to_datum(messages: list[dict[str, str]], renderer: ChatTemplateRenderer, max_length: int) -> tinker.Datum:
    """supervised/data.py: inputs are the tokens but the last, targets the tokens but the
    first, weights shifted alike and normalised to sum to 1 (reduction "mean")."""
    model_input, weights = renderer.build_supervised_example(messages)
    tokens = model_input.to_ints()[:max_length]
    weights = weights[1 : len(tokens)]
    weights = weights / weights.sum() if float(weights.sum()) > 0 else weights
    return tinker.Datum(
        model_input=tinker.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "weights": tinker.TensorData(data=weights.tolist(), dtype="float32", shape=list(weights.shape)),
            "target_tokens": tinker.TensorData(data=tokens[1:], dtype="int64", shape=[len(tokens) - 1]),
        },
    )


def compute_mean_nll(logprobs_list: list[tinker.TensorData], weights_list: list[tinker.TensorData]) -> float:
    """supervised/common.py: -Σ logprobs·weights / Σ weights over the batch."""
    total_weighted_logprobs, total_weights = 0.0, 0.0
    for logprobs, weights in zip(logprobs_list, weights_list, strict=True):
        total_weighted_logprobs += float(logprobs.to_torch().dot(weights.to_torch()))
        total_weights += float(weights.to_torch().sum())
    return float("nan") if total_weights == 0 else -total_weighted_logprobs / total_weights


def math_problems(seed: int, count: int, levels: tuple[int, ...]) -> list[Any]:
    return generate_problems(seed, count, list(levels), None)


def math_conversations(seed: int, count: int, levels: tuple[int, ...] = (1,)) -> list[dict[str, Any]]:
    """Rows like no_robots': {"messages": [user, assistant]}, the reply a worked solution
    ending in \\boxed{answer}."""
    rows = []
    for problem in math_problems(seed, count, levels):
        steps = " ".join(f"{label + ': ' if label else ''}{expression} = {value}."
                         for label, expression, value in problem.steps)  # fmt: skip
        rows.append({"messages": [{"role": "user", "content": problem.question + QUESTION_SUFFIX},
                                  {"role": "assistant", "content": f"{steps} \\boxed{{{problem.answer}}}"}]})  # fmt: skip
    return rows


def math_questions(seed: int, count: int, levels: tuple[int, ...] = (1,)) -> dict[str, list[str]]:
    """Columns like gsm8k's: "question", and "answer" ending in "#### N"."""
    problems = math_problems(seed, count, levels)
    return {"question": [p.question for p in problems], "answer": [f"#### {p.answer}" for p in problems]}


def extract_boxed(text: str) -> str:
    found = re.findall(r"\\boxed\{([^{}]*)\}", text)
    if not found:
        raise ValueError("no \\boxed{} answer")
    return found[-1]


def extract_gsm8k_final_answer(answer: str) -> str:
    return answer.split("####")[-1].strip()


def grade_answer(given: str, ground_truth: str) -> bool:
    def number(text: str) -> float | None:
        try:
            return float(text.replace(",", "").strip())
        except ValueError:
            return None

    given_number, truth_number = number(given), number(ground_truth)
    if given_number is not None and truth_number is not None:
        return abs(given_number - truth_number) < 1e-6
    return given.strip() == ground_truth.strip()


@dataclasses.dataclass
class CheckpointRecord:
    name: str
    batch: int
    state_path: str | None = None
    sampler_path: str | None = None


def save_checkpoint(training_client: tinker.TrainingClient, name: str, log_path: str, kind: str,
                    loop_state: dict[str, Any], ttl_seconds: int | None = None) -> dict[str, str]:  # fmt: skip
    """checkpoint_utils.save_checkpoint: save_state and/or save_weights_for_sampler, and
    a line in LOG_PATH/checkpoints.jsonl naming the paths."""
    paths: dict[str, str] = {}
    if kind in ("state", "both"):
        paths["state_path"] = training_client.save_state(name, ttl_seconds=ttl_seconds).result().path
    if kind in ("sampler", "both"):
        paths["sampler_path"] = training_client.save_weights_for_sampler(name, ttl_seconds=ttl_seconds).result().path
    Path(log_path).mkdir(parents=True, exist_ok=True)
    with open(Path(log_path) / "checkpoints.jsonl", "a") as out:
        out.write(json.dumps({"name": name, **loop_state, **paths}) + "\n")
    return paths


def get_last_checkpoint(log_path: str, required_key: str = "state_path") -> CheckpointRecord | None:
    """The last checkpoints.jsonl line that has `required_key`, to resume from."""
    path = Path(log_path) / "checkpoints.jsonl"
    if not path.is_file():
        return None
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    records = [r for r in records if r.get(required_key)]
    if not records:
        return None
    last = records[-1]
    return CheckpointRecord(last["name"], int(last.get("batch", 0)), last.get("state_path"), last.get("sampler_path"))


class MetricsLog:
    """ml_log's local part: each step's metrics as a line of LOG_PATH/metrics.jsonl and on stderr."""

    def __init__(self, log_path: str, config: Any) -> None:
        self.directory = Path(log_path)
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / "config.json").write_text(json.dumps(dataclasses.asdict(config), indent=2) + "\n")
        self.file = open(self.directory / "metrics.jsonl", "a")
        self.started = time.time()

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        row = {"step": step, **{k: float(v) for k, v in metrics.items()}}
        self.file.write(json.dumps(row) + "\n")
        self.file.flush()
        shown = ", ".join(f"{k}={v:.4g}" for k, v in row.items() if k != "step")
        print(f"step {step}: {shown}", file=sys.stderr, flush=True)

    def close(self) -> None:
        self.file.close()
