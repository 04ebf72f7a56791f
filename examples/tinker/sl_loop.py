"""
Minimal supervised fine-tuning script without abstractions, against `ponder tinker-serve`.

A copy of tinker_cookbook 0.6.1's tinker_cookbook/recipes/sl_loop.py (the `tinker`
0.38.0 client, unchanged calls), with what needs the hub replaced: the base model is
the server's (smollm2-135m, the embedded model), the tokenizer comes from the
training client (get_tokenizer(): the server's copy), the renderer is the tokenizer's
chat template and the no_robots dataset is ponder's generated arithmetic problems
(examples/tinker/cookbook_parts.py). Start the server, then:

    ponder tinker-serve --model smollm2-135m --port 8000 &
    TINKER_API_KEY=tml-local python examples/tinker/sl_loop.py base_url=http://127.0.0.1:8000 \\
        model_name=smollm2-135m batch_size=8 max_steps=20 log_path=runs/tinker-sl

Each step logs train_mean_nll (metrics.jsonl in log_path); it falls as the model
learns the worked solutions.
"""

import dataclasses
import logging
import sys
import time

import tinker
from cookbook_parts import (
    ChatTemplateRenderer,
    MetricsLog,
    compute_mean_nll,
    conversation_to_datum,
    get_last_checkpoint,
    math_conversations,
    parse_config,
    save_checkpoint,
)

logger = logging.getLogger(__name__)
logging.getLogger("httpx").setLevel(logging.WARN)


@dataclasses.dataclass
class Config:
    base_url: str | None = None
    log_path: str = "runs/tinker-sl-loop"
    model_name: str = "smollm2-135m"  # the cookbook's default is Qwen/Qwen3.5-9B-Base
    batch_size: int = 128
    learning_rate: float = 1e-4
    max_length: int = 32768
    lora_rank: int = 32
    save_every: int = 20  # 0 = disabled
    ttl_seconds: int | None = 604800  # 7 days
    max_steps: int | None = None
    n_examples: int = 2048  # the generated dataset's size (no_robots has 9.5k)
    seed: int = 0


def main(config: Config):
    # Setup logging
    ml_logger = MetricsLog(config.log_path, config)

    # Load the dataset (no_robots in the cookbook: here, generated worked solutions)
    logger.info("Loading dataset...")
    train_dataset = math_conversations(config.seed, config.n_examples)

    # Drop the last incomplete batch (like PyTorch's drop_last=True) — a partial
    # batch has different effective gradient magnitude, which can cause a training spike.
    n_train_batches = len(train_dataset) // config.batch_size
    logger.info(f"Train batches: {n_train_batches}")

    # Setup training client
    service_client = tinker.ServiceClient(base_url=config.base_url)

    # Check for resuming
    resume_info = get_last_checkpoint(config.log_path)
    if resume_info:
        training_client = service_client.create_training_client_from_state_with_optimizer(
            resume_info.state_path
        ).result()
        start_batch = resume_info.batch
        logger.info(f"Resuming from batch {start_batch}")
    else:
        training_client = service_client.create_lora_training_client(
            base_model=config.model_name, rank=config.lora_rank
        ).result()
        start_batch = 0

    # Get tokenizer and renderer (the cookbook loads them from the hub before the client)
    tokenizer = training_client.get_tokenizer()
    renderer = ChatTemplateRenderer(tokenizer)

    # Training loop (single epoch)
    total_steps = n_train_batches if config.max_steps is None else min(n_train_batches, config.max_steps)
    logger.info(f"Training for {total_steps} steps")

    for batch_idx in range(start_batch, n_train_batches):
        if config.max_steps is not None and batch_idx >= config.max_steps:
            break

        start_time = time.time()
        step = batch_idx
        metrics = {}

        # Save checkpoint
        if config.save_every > 0 and step % config.save_every == 0 and step > 0:
            save_checkpoint(
                training_client=training_client,
                name=f"{step:06d}",
                log_path=config.log_path,
                kind="state",
                loop_state={"batch": batch_idx},
                ttl_seconds=config.ttl_seconds,
            )

        # Linear learning rate schedule
        lr_mult = max(0.0, 1.0 - step / n_train_batches)
        current_lr = config.learning_rate * lr_mult
        adam_params = tinker.AdamParams(learning_rate=current_lr, beta1=0.9, beta2=0.95, eps=1e-8)

        # Get training batch and convert to datums online
        batch_start = batch_idx * config.batch_size
        batch_end = min((batch_idx + 1) * config.batch_size, len(train_dataset))
        batch_rows = train_dataset[batch_start:batch_end]

        batch = [conversation_to_datum(row["messages"], renderer, config.max_length) for row in batch_rows]

        # Training step
        fwd_bwd_future = training_client.forward_backward(batch, loss_fn="cross_entropy")
        optim_step_future = training_client.optim_step(adam_params)

        fwd_bwd_result = fwd_bwd_future.result()
        optim_result = optim_step_future.result()

        if optim_result.metrics:
            metrics.update(optim_result.metrics)

        # Compute train metrics
        train_logprobs = [x["logprobs"] for x in fwd_bwd_result.loss_fn_outputs]
        train_weights = [d.loss_fn_inputs["weights"] for d in batch]
        train_nll = compute_mean_nll(train_logprobs, train_weights)

        # Log metrics
        metrics.update(
            num_sequences=len(batch),
            num_tokens=sum(d.model_input.length for d in batch),
            learning_rate=current_lr,
            train_mean_nll=train_nll,
            progress=step / n_train_batches,
            time_total=time.time() - start_time,
        )
        ml_logger.log_metrics(metrics=metrics, step=step)

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
