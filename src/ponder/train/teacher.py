"""Teachers for on-policy distillation (algo.distill_coef, the recipe's `teacher`):
logprob sources for the tokens the student sampled.

A teacher is any model ponder loads (a run, stage or checkpoint directory, a Hugging
Face directory, the embedded model), run in this process under no_grad on the batch
the update trains on; or an OpenAI-compatible server that returns prompt logprobs
for given token ids (`ponder serve`, or vLLM: `/v1/completions` with
`prompt_logprobs`), named by its URL. One teacher for every task, or one per task
kind or per part of a mixture of environments (env.kind mixture). Teachers must
share the student's tokenizer: the student's token ids are scored as they are, so a
different vocabulary is refused with one line rather than scored into nonsense (a
server's, by how it tokenises a probe text).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
import torch

from ponder.config.sections import TeacherConfig
from ponder.models.forward import forward_policy
from ponder.models.loading import Policy, load_policy
from ponder.train.batch import TokenBatch
from ponder.train.update import forward_pass_no_grad

API_KEY_ENV = "PONDER_TEACHER_API_KEY"  # a URL teacher's key, kept out of recipes
EVERY_KIND = ""  # the teacher of every task (teacher.model given as one source)
PROBE = "A probe: 12 + 7 = 19, then <tool_call> and \u00e9t\u00e9."  # text whose tokenisation must match
Scorer = Callable[[TokenBatch, int, float], torch.Tensor]  # (rows, micro batch, temperature) -> [b, L-1]


@dataclass
class Teacher:
    """scorers: task kind, or a mixture's part name, -> what scores that kind's rows
    (a part's: the rows of every kind of that part without a teacher of its own;
    EVERY_KIND: every row whose kind and part have none)."""

    scorers: dict[str, Scorer]

    def token_logprobs(self, batch: TokenBatch, kinds: list[str], micro_batch_size: int,
                       temperature: float) -> torch.Tensor:  # fmt: skip
        """[B, L-1] each row's teacher log-probabilities of its tokens (aligned as
        batch.old_logprobs) on its policy tokens; a row whose kind has no teacher keeps
        the student's own (its distillation advantage is then 0)."""
        out = batch.old_logprobs.clone()
        for rows, scorer in self._parts(kinds):
            part = batch.select(rows)
            scores = scorer(part, micro_batch_size, temperature).to(out.device)
            width = scores.shape[1]
            out[rows, :width] = torch.where(part.loss_mask.bool(), scores, out[rows, :width])
        return out

    def topk(self, batch: TokenBatch, kinds: list[str], micro_batch_size: int, temperature: float,
             k: int) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """Each position's k likeliest next tokens under the row's teacher: (ids [B, L-1,
        k] long, their log-probabilities [B, L-1, k]); NaN log-probabilities on the rows
        no teacher scores (teacher.loss topk leaves them out)."""
        shape = (*batch.old_logprobs.shape, k)
        ids = torch.zeros(shape, dtype=torch.long, device=batch.old_logprobs.device)
        logprobs = torch.full(shape, float("nan"), device=batch.old_logprobs.device)
        for rows, scorer in self._parts(kinds):
            part_ids, part_logprobs = scorer.topk(batch.select(rows), micro_batch_size, temperature, k)
            width = part_ids.shape[1]
            ids[rows, :width], logprobs[rows, :width] = part_ids.to(ids.device), part_logprobs.to(logprobs.device)
        return ids, logprobs

    def logits(self, part: TokenBatch, kinds: list[str], keep: torch.Tensor,
               temperature: float) -> tuple[torch.Tensor, list[int]]:  # fmt: skip
        """The teacher's next-token logits / temperature at positions `keep` [K] of the
        rows it scores: ([rows, K, V], those rows' indices in `part`), for
        teacher.loss gkd (in-process teachers only)."""
        pieces, covered = [], []
        for rows, scorer in self._parts(kinds):
            pieces.append(scorer.logits(part.select(rows), keep, temperature))
            covered += rows
        if not pieces:
            return part.input_ids.new_zeros((0, len(keep), 0), dtype=torch.float), []
        return torch.cat(pieces), covered

    def teacher_of(self, kind: str) -> str | None:
        """The key in `scorers` of the teacher of task kind `kind`: its own, else its
        part's (the kind's prefix before `/`: a mixture's part, `math` for
        `math/level1`, ponder.envs.mixture), else the every-kind one; None for none."""
        for key in (kind, kind.split("/", 1)[0], EVERY_KIND):
            if key in self.scorers:
                return key
        return None

    def _parts(self, kinds: list[str]) -> list[tuple[list[int], Scorer]]:
        """(the rows each scorer scores, that scorer), by teacher_of; rows of a kind with
        no teacher are not listed."""
        chosen = [self.teacher_of(kind) for kind in kinds]
        parts = []
        for key, scorer in self.scorers.items():
            rows = [i for i, k in enumerate(chosen) if k == key]
            if rows:
                parts.append((rows, scorer))
        return parts


def load_teacher(config: TeacherConfig, student: Policy) -> Teacher | None:
    """The recipe's teacher(s), or None without one; ValueError naming the teacher for
    a tokenizer that is not the student's."""
    if not config.model:
        return None
    sources = dict(config.model) if isinstance(config.model, dict) else {EVERY_KIND: config.model}
    return Teacher({kind: _scorer(str(source), config, student) for kind, source in sources.items()})


def check_teacher_kinds(config: TeacherConfig, kinds: set[str]) -> None:
    """ValueError when teacher.model's mapping names a key that is no task kind of
    `kinds` (the training tasks') nor a part of one (before `/`): its teacher would
    score nothing, silently."""
    if not isinstance(config.model, dict):
        return
    known = kinds | {kind.split("/", 1)[0] for kind in kinds}
    stray = [key for key in config.model if key != EVERY_KIND and key not in known]
    if stray:
        raise ValueError(f"teacher.model: {stray[0]!r} is no task kind or mixture part of the training tasks "
                         f"(those: {', '.join(sorted(known))})")  # fmt: skip


def _scorer(source: str, config: TeacherConfig, student: Policy) -> Scorer:
    if source.startswith(("http://", "https://")):
        if config.loss == "gkd":
            raise ValueError(f"teacher.loss gkd reads the teacher's whole next-token distribution, which a server "
                             f"does not return: teacher.model {source!r} needs teacher.loss opd or topk")  # fmt: skip
        teacher = UrlTeacher(source, config.served_model, os.environ.get(API_KEY_ENV) or None)
        teacher.check_tokenizer(student.tokenizer)
        return teacher
    dtype = config.dtype if config.dtype != "auto" else str(student.dtype).removeprefix("torch.")
    policy = load_policy(source, dtype, str(student.device))
    if policy.tokenizer.get_vocab() != student.tokenizer.get_vocab():
        raise ValueError(_mismatch(source, f"{len(policy.tokenizer)} vs {len(student.tokenizer)} tokens"))
    policy.model.eval()
    return ModelScorer(policy)


class ModelScorer:
    """An in-process teacher: its forward passes under no_grad, `micro_batch_size` rows
    at a time, on the rows the student sampled."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy

    def __call__(self, part: TokenBatch, micro_batch_size: int, temperature: float) -> torch.Tensor:
        return forward_pass_no_grad(self.policy, part, micro_batch_size, temperature)

    @torch.no_grad()
    def logits(self, part: TokenBatch, keep: torch.Tensor, temperature: float) -> torch.Tensor:
        """[b, K, V] the next-token logits / temperature at positions `keep`."""
        kept: list[tuple[torch.Tensor, torch.Tensor]] = []
        forward_policy(self.policy.model, part.input_ids, part.attention_mask, temperature,
                       loss_mask=_at(keep, part.loss_mask), kept_logits=kept)  # fmt: skip
        return kept[0][1]

    def topk(self, part: TokenBatch, micro_batch_size: int, temperature: float,
             k: int) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """([b, L-1, k] ids, [b, L-1, k] log-probabilities) at the policy positions."""
        ids = torch.zeros((*part.old_logprobs.shape, k), dtype=torch.long)
        logprobs = torch.zeros(ids.shape)
        for start in range(0, len(part), micro_batch_size):
            rows = list(range(start, min(start + micro_batch_size, len(part))))
            micro = part.select(rows)
            keep = micro.loss_mask.bool().any(0).nonzero().squeeze(-1)
            top = torch.log_softmax(self.logits(micro, keep, temperature).float(), dim=-1).topk(k, dim=-1)
            ids[start : start + len(rows), keep] = top.indices.cpu()
            logprobs[start : start + len(rows), keep] = top.values.cpu()
        return ids, logprobs


def _at(keep: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """A loss mask [b, L-1] that is 1 at columns `keep` in every row (so a forward keeps
    exactly those positions)."""
    mask = torch.zeros_like(loss_mask)
    mask[:, keep] = 1
    return mask


def _mismatch(name: str, how: str) -> str:
    return (f"teacher.model {name!r}: its tokenizer is not the student's ({how}); distillation scores the "
            "student's token ids, so both must share one vocabulary")  # fmt: skip


class UrlTeacher:
    """A teacher behind an OpenAI-compatible server: each row's token ids are sent as
    a completions prompt with vLLM's `prompt_logprobs: 0` and the logprob of every
    prompt token read back (at the server's temperature 1: the recipe's sampling
    temperature is not sent). `model`: the served model's name ("": the server's first)."""

    def __init__(self, url: str, model: str = "", api_key: str | None = None, concurrency: int = 8) -> None:
        self.url = url.rstrip("/").removesuffix("/v1") + "/v1"
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.Client(headers=headers, timeout=300)
        self.model = model or self.client.get(f"{self.url}/models").raise_for_status().json()["data"][0]["id"]
        self.concurrency = concurrency

    def prompt_logprobs(self, prompt: str | list[int]) -> tuple[list[int], list[float]]:
        """(the server's token ids of `prompt`, each one's logprob after the ones before it)."""
        positions = self._positions(prompt, 0)
        ids = [int(next(iter(position))) for position in positions]
        return ids, [position[str(token)]["logprob"] for position, token in zip(positions, ids)]

    def _positions(self, prompt: str | list[int], top: int) -> list[dict[str, dict]]:
        """vLLM's prompt_logprobs entries after the first token: {token id: {logprob,
        rank}}, the prompt's own token first, then the `top` likeliest."""
        reply = self.client.post(f"{self.url}/completions", json={"model": self.model, "prompt": prompt,
                                                                  "max_tokens": 1, "prompt_logprobs": top})  # fmt: skip
        if reply.status_code != 200:
            raise ValueError(f"teacher {self.url}: HTTP {reply.status_code}: {reply.text[:300]}")
        return reply.json()["choices"][0]["prompt_logprobs"][1:]

    def topk(self, part: TokenBatch, micro_batch_size: int, temperature: float,
             k: int) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """([b, L-1, k] ids, log-probabilities): each position's k likeliest tokens by
        their rank in the server's `top_logprobs`."""
        lengths = part.attention_mask.sum(-1).tolist()
        rows = [part.input_ids[i, : int(n)].tolist() for i, n in enumerate(lengths)]
        ids = torch.zeros((*part.old_logprobs.shape, k), dtype=torch.long)
        logprobs = torch.zeros(ids.shape)
        with ThreadPoolExecutor(self.concurrency) as pool:
            for i, positions in enumerate(pool.map(lambda row: self._positions(row, k), rows)):
                for t, position in enumerate(positions):
                    ranked = sorted(((v["rank"], int(token), v["logprob"]) for token, v in position.items()))[:k]
                    ids[i, t] = torch.tensor([token for _, token, _ in ranked])
                    logprobs[i, t] = torch.tensor([logprob for _, _, logprob in ranked])
        return ids, logprobs

    def check_tokenizer(self, tokenizer) -> None:
        """ValueError unless the server splits a probe text as `tokenizer` does (its
        first token has no logprob; a server that adds a BOS token puts it first)."""
        ids, _ = self.prompt_logprobs(PROBE)
        mine = tokenizer.encode(PROBE, add_special_tokens=False)
        if ids not in (mine[1:], mine):
            raise ValueError(_mismatch(self.url, f"it splits a probe text into {len(ids) + 1} tokens, the student "
                                                 f"into {len(mine)}"))  # fmt: skip

    def __call__(self, part: TokenBatch, micro_batch_size: int, temperature: float) -> torch.Tensor:
        lengths = part.attention_mask.sum(-1).tolist()
        rows = [part.input_ids[i, : int(n)].tolist() for i, n in enumerate(lengths)]
        out = torch.zeros(part.old_logprobs.shape)
        with ThreadPoolExecutor(self.concurrency) as pool:
            for i, (_, logprobs) in enumerate(pool.map(self.prompt_logprobs, rows)):
                out[i, : len(logprobs)] = torch.tensor(logprobs)
        return out
