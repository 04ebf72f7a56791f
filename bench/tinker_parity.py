"""Does `ponder tinker-serve` train as ponder's own SFT trainer does? The same LoRA
start (same seed), the same batches of ponder's generated worked solutions and the same
AdamW settings, stepped twice: once by the `tinker` client through a loopback server
(cross_entropy, each datum's weights 1 / the batch's reply tokens, so its loss:sum is
the batch's token-mean NLL), once by ponder's SFT step (train/sft.py: sft_batch,
masked_nll_pass, optimizer_step). Prints each step's loss and gradient norm from both
and the largest weight difference after the last step.

    .venv/bin/python bench/tinker_parity.py --steps 5 --batch 8    # the embedded model
    .venv/bin/python bench/tinker_parity.py --smoke                # the tiny model
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from ponder.config import OptimConfig  # noqa: E402
from ponder.data.format import TokenizedExample  # noqa: E402
from ponder.envs.math_tasks import generate_problems  # noqa: E402
from ponder.models.logprobs import trainable_snapshot  # noqa: E402
from ponder.serve.tinker import TinkerConfig, TinkerService  # noqa: E402
from ponder.serve.tinker.server import build_tinker_server  # noqa: E402
from ponder.serve.tinker.training import LoraLayout, lora_copy  # noqa: E402
from ponder.train.optim import build_optimizer, optimizer_step  # noqa: E402
from ponder.train.sft import masked_nll_pass, sft_batch  # noqa: E402

API_KEY = "tml-parity"


def conversations(tokenizer, count: int, seed: int) -> list[tuple[list[int], list[int]]]:
    """(tokens, reply mask) per generated problem: the chat template's prompt, then the
    worked solution ending in \\boxed{answer} and the end-of-turn token."""
    rows = []
    for problem in generate_problems(seed, count, [1, 2], None):
        steps = " ".join(f"{expression} = {value}." for _, expression, value in problem.steps)
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": problem.question}], tokenize=False,
                                               add_generation_prompt=True)  # fmt: skip
        prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
        reply = tokenizer.encode(f"{steps} \\boxed{{{problem.answer}}}", add_special_tokens=False)
        reply += [tokenizer.eos_token_id]
        rows.append((prompt_ids + reply, [0] * len(prompt_ids) + [1] * len(reply)))
    return rows


def tinker_batch(rows: list[tuple[list[int], list[int]]]):
    """Datums whose weights sum to 1 over the whole batch: loss:sum = the token-mean NLL."""
    from tinker import types

    tokens_in_batch = sum(sum(mask[1:]) for _, mask in rows)
    return [types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                        loss_fn_inputs={"target_tokens": tokens[1:],
                                        "weights": [m / tokens_in_batch for m in mask[1:]]})
            for tokens, mask in rows]  # fmt: skip


def serve(service: TinkerService):
    server = build_tinker_server(service, "warning")
    server.config.port = 0
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    return server, thread, server.servers[0].sockets[0].getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--smoke", action="store_true", help="the tiny model, 2 steps of 2")
    parser.add_argument("--out", help="write the figures here as JSON")
    args = parser.parse_args(argv)
    if args.smoke:
        args.model, args.steps, args.batch, args.lr = "tiny", 2, 2, 1e-2
    os.environ.setdefault("TINKER_TELEMETRY", "0")
    import tinker

    config = TinkerConfig(model=args.model, device="cpu", state_dir=tempfile.mkdtemp(prefix="tinker-parity-"))
    service = TinkerService.load(config)
    server, thread, port = serve(service)
    client = tinker.ServiceClient(base_url=f"http://127.0.0.1:{port}", api_key=API_KEY)
    training = client.create_lora_training_client(base_model=args.model, rank=args.rank, seed=args.seed).result()
    local = lora_copy(service.bases[args.model], LoraLayout(rank=args.rank), seed=args.seed)
    params = [p for p in local.model.parameters() if p.requires_grad]
    optimizer, scheduler = build_optimizer(params, OptimConfig(lr=args.lr, max_grad_norm=1.0), args.steps)
    adam = tinker.AdamParams(learning_rate=args.lr, beta1=0.9, beta2=0.999, eps=1e-8, grad_clip_norm=1.0)
    rows = conversations(local.tokenizer, args.steps * args.batch, args.seed)
    steps = []
    for step in range(args.steps):
        batch = rows[step * args.batch : (step + 1) * args.batch]
        fwd_bwd = training.forward_backward(tinker_batch(batch), "cross_entropy")
        optim = training.optim_step(adam)
        served_loss, served_norm = fwd_bwd.result().metrics["loss:sum"], optim.result().metrics["grad_norm"]
        examples = [TokenizedExample(tokens, mask) for tokens, mask in batch]
        ponder_loss = masked_nll_pass(local, sft_batch(examples, local.tokenizer.pad_token_id), micro_batch_size=4)
        ponder_norm, _ = optimizer_step(params, optimizer, scheduler, 1.0)
        steps.append({"step": step, "tinker_loss": served_loss, "ponder_loss": ponder_loss,
                      "tinker_grad_norm": served_norm, "ponder_grad_norm": ponder_norm})  # fmt: skip
        print(f"| {step} | {served_loss:.6f} | {ponder_loss:.6f} | {abs(served_loss - ponder_loss):.2e} | "
              f"{served_norm:.5f} | {ponder_norm:.5f} |", flush=True)  # fmt: skip
    served = trainable_snapshot(service.models[training.model_id].policy.model)
    mine = trainable_snapshot(local.model)
    gap = max(float((a - b).abs().max()) for a, b in zip(served.values(), mine.values()))
    scale = max(float(b.abs().max()) for b in mine.values())
    print(f"largest weight difference after {args.steps} steps: {gap:.2e} (largest weight {scale:.3f})")
    client.close("success").result()
    server.should_exit = True
    thread.join(timeout=30)
    service.close()
    if args.out:
        Path(args.out).write_text(json.dumps({"model": args.model, "steps": steps, "max_weight_diff": gap,
                                              "max_weight": scale}, indent=2) + "\n")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
