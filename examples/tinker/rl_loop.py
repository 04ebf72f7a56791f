"""
Minimal RL training loop using GRPO-style reward centering, against `ponder tinker-serve`.

A copy of tinker_cookbook 0.6.1's tinker_cookbook/recipes/rl_loop.py (the `tinker`
0.38.0 client, unchanged calls), with what needs the hub replaced: the base model is
the server's (smollm2-135m, the embedded model), the tokenizer comes from the training
client, the renderer is the tokenizer's chat template and GSM8K is ponder's generated
arithmetic problems with GSM8K's "#### N" answers (examples/tinker/cookbook_parts.py).
The loss defaults to importance_sampling, one of the cookbook's choices (its default,
stable_reinforce, is not one this server has). Start the server, then:

    ponder tinker-serve --model smollm2-135m --port 8000 &
    TINKER_API_KEY=tml-local python examples/tinker/rl_loop.py base_url=http://127.0.0.1:8000 \\
        model_name=smollm2-135m batch_size=8 group_size=8 max_tokens=96 max_steps=10 log_path=runs/tinker-rl

Variable naming convention (see the cookbook's CONTRIBUTING.md):
    _P: Problem dimension (different questions/prompts in a batch)
    _G: Group dimension (multiple rollouts per problem for variance reduction)
    _T: Token/Time dimension (sequence positions)
    _D: Datum dimension (training examples after flattening)

Each batch logs reward/total, the mean reward of its samples (metrics.jsonl in log_path).
"""

import dataclasses
import logging
import sys
import time

import tinker
import torch
from cookbook_parts import (
    ChatTemplateRenderer,
    MetricsLog,
    extract_boxed,
    extract_gsm8k_final_answer,
    get_last_checkpoint,
    grade_answer,
    math_questions,
    parse_config,
    save_checkpoint,
)
from tinker import types
from tinker.types.tensor_data import TensorData

logger = logging.getLogger(__name__)
logging.getLogger("httpx").setLevel(logging.WARN)


@dataclasses.dataclass
class Config:
    base_url: str | None = None
    log_path: str = "runs/tinker-rl-loop"
    model_name: str = "smollm2-135m"  # the cookbook's default is Qwen/Qwen3.5-9B-Base
    batch_size: int = 128
    group_size: int = 16
    learning_rate: float = 4e-5
    lora_rank: int = 32
    save_every: int = 20  # 0 = disabled
    max_tokens: int = 256
    loss_fn: str = "importance_sampling"  # the cookbook's: importance_sampling, cispo, gspo, stable_reinforce
    ttl_seconds: int | None = 604800  # 7 days
    max_steps: int | None = None
    n_questions: int = 2048  # the generated dataset's size (gsm8k's train split has 7.5k)
    # Start from these weights (a save_state path, e.g. sl_loop.py's final state), with a
    # fresh optimizer, as the cookbook's rl/train.py does; None = the base model.
    load_checkpoint_path: str | None = None
    seed: int = 0


def get_reward(response: str, answer: str) -> float:
    try:
        given_answer = extract_boxed(response)
        ground_truth = extract_gsm8k_final_answer(answer)
        return 1.0 if grade_answer(given_answer, ground_truth) else 0.0
    except ValueError:
        return 0.0


def main(config: Config):
    # Setup logging
    ml_logger = MetricsLog(config.log_path, config)

    # Load the dataset (GSM8K in the cookbook: here, generated problems in its layout)
    logger.info("Loading dataset...")
    train_dataset = math_questions(config.seed, config.n_questions)

    question_suffix = " Provide a numerical answer without units, written inside \\boxed{}."

    convo_prefix = [
        {
            "role": "user",
            "content": "How many r's are in strawberry?" + question_suffix,
        },
        {
            "role": "assistant",
            "content": "Let's spell the word out and number all the letters: 1) s 2) t 3) r 4) a 5) w 6) b 7) e 8) r 9) r 10) y. We have r's at positions 3, 8, and 9. \\boxed{3}",
        },
    ]

    n_train_batches = len(train_dataset["question"]) // config.batch_size

    # Setup training client
    service_client = tinker.ServiceClient(base_url=config.base_url)

    resume_info = get_last_checkpoint(config.log_path)
    if resume_info:
        training_client = service_client.create_training_client_from_state_with_optimizer(
            resume_info.state_path
        ).result()
        start_batch = resume_info.batch
        logger.info(f"Resuming from batch {start_batch}")
    elif config.load_checkpoint_path:
        training_client = service_client.create_training_client_from_state(config.load_checkpoint_path).result()
        start_batch = 0
        logger.info(f"Starting from {config.load_checkpoint_path}")
    else:
        training_client = service_client.create_lora_training_client(
            base_model=config.model_name, rank=config.lora_rank
        ).result()
        start_batch = 0

    # Get tokenizer and renderer (the cookbook loads them from the hub before the client)
    tokenizer = training_client.get_tokenizer()
    renderer = ChatTemplateRenderer(tokenizer)

    sampling_params = tinker.types.SamplingParams(
        max_tokens=config.max_tokens,
        stop=renderer.get_stop_sequences(),
    )
    # Optimizer step
    adam_params = types.AdamParams(learning_rate=config.learning_rate, beta1=0.9, beta2=0.95, eps=1e-8)

    total_steps = n_train_batches if config.max_steps is None else min(n_train_batches, config.max_steps)
    logger.info(f"Training for {total_steps} batches")

    # Main training loop
    for batch_idx in range(start_batch, n_train_batches):
        if config.max_steps is not None and batch_idx >= config.max_steps:
            break

        t_start = time.time()
        metrics: dict[str, float] = {
            "progress/batch": batch_idx,
            "optim/lr": config.learning_rate,
            "progress/done_frac": (batch_idx + 1) / n_train_batches,
        }

        # Save checkpoint
        if config.save_every > 0 and batch_idx % config.save_every == 0 and batch_idx > 0:
            save_checkpoint(
                training_client=training_client,
                name=f"{batch_idx:06d}",
                log_path=config.log_path,
                kind="state",
                loop_state={"batch": batch_idx},
                ttl_seconds=config.ttl_seconds,
            )

        # Get training batch and convert to datums online
        batch_start = batch_idx * config.batch_size
        batch_end = min((batch_idx + 1) * config.batch_size, len(train_dataset["question"]))
        batch_rows = {key: column[batch_start:batch_end] for key, column in train_dataset.items()}

        sampling_client = training_client.save_weights_and_get_sampling_client().result()

        datums_D: list[types.Datum] = []
        rewards_P: list[float] = []
        futures_P: list[tinker.APIFuture[types.SampleResponse]] = []
        prompts_P: list[types.ModelInput] = []
        for question in batch_rows["question"]:
            convo = [
                *convo_prefix,
                {"role": "user", "content": question + question_suffix},
            ]
            model_input = renderer.build_generation_prompt(convo)

            # Generate group_size responses in a single call
            future = sampling_client.sample(
                prompt=model_input,
                num_samples=config.group_size,
                sampling_params=sampling_params,
            )
            futures_P.append(future)
            prompts_P.append(model_input)

        for future, prompt, answer in zip(futures_P, prompts_P, batch_rows["answer"]):
            sample_result = future.result()
            rewards_G: list[float] = []
            sampled_tokens_G_T: list[list[int]] = []
            logprobs_G_T: list[list[float]] = []
            for sequence in sample_result.sequences:
                sampled_tokens = sequence.tokens
                sampled_logprobs = sequence.logprobs
                assert sampled_logprobs is not None

                sampled_tokens_G_T.append(sampled_tokens)
                logprobs_G_T.append(sampled_logprobs)

                parsed_message, _ = renderer.parse_response(sampled_tokens)
                reward = get_reward(parsed_message["content"], answer)
                rewards_G.append(reward)

            mean_reward = sum(rewards_G) / len(rewards_G)
            advantages_G = [reward - mean_reward for reward in rewards_G]
            rewards_P.append(mean_reward)

            # check if all advantages are zero
            if all(advantage == 0.0 for advantage in advantages_G):
                # Skip question because all advantages are the same
                continue

            for sampled_tokens, logprobs, advantage in zip(sampled_tokens_G_T, logprobs_G_T, advantages_G):
                ob_len = prompt.length - 1
                model_input = prompt.append(types.EncodedTextChunk(tokens=sampled_tokens[:-1]))
                target_tokens = [0] * ob_len + sampled_tokens
                padded_logprobs = [0.0] * ob_len + logprobs
                padded_advantages = [0.0] * ob_len + [advantage] * (model_input.length - ob_len)
                assert model_input.length == len(target_tokens) == len(padded_logprobs) == len(padded_advantages)
                loss_fn_inputs = {
                    "target_tokens": TensorData.from_torch(torch.tensor(target_tokens)),
                    "logprobs": TensorData.from_torch(torch.tensor(padded_logprobs)),
                    "advantages": TensorData.from_torch(torch.tensor(padded_advantages)),
                }
                datum = types.Datum(model_input=model_input, loss_fn_inputs=loss_fn_inputs)
                datums_D.append(datum)

        # Training step
        if len(datums_D) == 0:
            logger.warning("Batch %d: all advantages zero, skipping training step", batch_idx)
        else:
            fwd_bwd_future = training_client.forward_backward(datums_D, loss_fn=config.loss_fn)
            optim_step_future = training_client.optim_step(adam_params)
            _fwd_bwd_result = fwd_bwd_future.result()
            optim_result = optim_step_future.result()

            if optim_result.metrics:
                metrics.update(optim_result.metrics)

        # Log metrics
        metrics["time/total"] = time.time() - t_start
        metrics["reward/total"] = sum(rewards_P) / len(rewards_P)
        ml_logger.log_metrics(metrics, step=batch_idx)

    # Save final checkpoint
    save_checkpoint(
        training_client=training_client,
        name="final",
        log_path=config.log_path,
        kind="both",
        loop_state={"batch": n_train_batches},
        ttl_seconds=None,
    )
    ml_logger.close()
    service_client.close("success").result()
    logger.info("Training completed")


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    main(parse_config(Config, sys.argv[1:]))
