"""perplexity.py — llama-perplexity's method: n_ctx chunks, BOS per chunk, score the second half of each.

Mirrors perplexity() in llama.cpp's tools/perplexity/perplexity.cpp: the stream (tokenized once, with BOS
when the vocab adds it) is cut into n_ctx-token chunks; each chunk runs in a fresh context with its first
token replaced by BOS; positions first = n_ctx/2 (integer division) ... n_ctx-2 predict the next token, so
a chunk scores n_ctx - first - 1 tokens (n_ctx/2 - 1 for even n_ctx). The progress text is llama.cpp's.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from pi2.errors import UsageError

Progress = Callable[[str], None]
_ROWS_PER_BLOCK = 16


@dataclass
class PerplexityResult:
    ppl: float                      # exp(mean NLL) over every scored token
    stderr: float                   # llama.cpp's error: ppl * sqrt((E[nll^2] - E[nll]^2) / (count - 1))
    chunk_ppls: list[float] = field(default_factory=list)  # the running value printed after each chunk
    n_tokens_scored: int = 0
    nll: float = 0.0                # mean negative log-likelihood (nats per token)


def format_final(result: PerplexityResult) -> str:
    """The closing line of llama-perplexity: 'Final estimate: PPL = %.4lf +/- %.5lf'."""
    return f"Final estimate: PPL = {result.ppl:.4f} +/- {result.stderr:.5f}"


def tokenize_input(tokenize: Callable[[str], list[int]], text: str, progress: Progress | None = None) -> list[int]:
    """Tokenize the whole corpus once (the caller's tokenize adds BOS per the vocab), with llama.cpp's lines."""
    emit = progress or (lambda s: None)
    emit("perplexity: tokenizing the input ..\n")
    t0 = time.perf_counter()
    tokens = list(tokenize(text))
    emit(f"perplexity: tokenization took {1e3 * (time.perf_counter() - t0):g} ms\n")
    return tokens


def nll_of_rows(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Negative log-probability of targets[i] under row i: float32 logit - max, float64 sum of float32 exp."""
    x = np.asarray(logits, dtype=np.float32)
    out = np.empty(x.shape[0], dtype=np.float64)
    for r in range(0, x.shape[0], _ROWS_PER_BLOCK):  # bounded temporaries for 150k-token vocabularies
        xb, tb = x[r:r + _ROWS_PER_BLOCK], targets[r:r + _ROWS_PER_BLOCK]
        mx = xb.max(axis=1)
        # llama.cpp: libm expf of each float32 difference, summed in double; exp in double rounded to float32 is
        # glibc's expf but for its rare 0.502-ulp cases (numpy's float32 exp is further off, enough to move the
        # 4th decimal of a perplexity in the hundreds)
        sum_exp = np.exp((xb - mx[:, None]).astype(np.float64)).astype(np.float32).sum(axis=1, dtype=np.float64)
        picked = xb[np.arange(xb.shape[0]), tb] - mx  # float32, as in log_softmax()
        out[r:r + xb.shape[0]] = np.log(sum_exp) - picked.astype(np.float64)
    return out


def _eta_line(t_pass: float, n_chunk: int) -> str:
    total = int(t_pass * n_chunk)  # one chunk per pass in pi2 (llama.cpp's n_seq = 1)
    line = f"perplexity: {t_pass:.2f} seconds per pass - ETA "
    if total >= 3600:
        line += f"{total // 3600} hours "
        total %= 3600
    return line + f"{total / 60.0:.2f} minutes\n"


def perplexity(eval_chunk: Callable[[list[int]], np.ndarray], tokens: list[int], n_ctx: int, *,
               n_chunks: int = -1, bos_id: int | None, add_bos: bool,
               progress: Progress | None = None, n_batch: int = 2048) -> PerplexityResult:
    """Perplexity of a token stream, chunk by chunk, exactly as llama-perplexity computes it.

    eval_chunk(chunk) evaluates n_ctx tokens in a fresh context and returns float32 logits, either for every
    position (n_ctx, n_vocab) or only for positions first ... n_ctx-1 (n_ctx - n_ctx//2, n_vocab), the rows
    llama.cpp requests. n_chunks < 0 means all whole chunks (--chunks caps, never extends). n_batch only
    feeds the header line: pi2 evaluates one chunk per pass, so it prints n_seq=1. progress receives
    llama-perplexity's output fragments verbatim, ending with the Final estimate line.
    """
    emit = progress or (lambda s: None)
    if n_ctx < 2:
        raise UsageError(f"perplexity needs a context of at least 2 tokens, got n_ctx={n_ctx}")
    if len(tokens) < 2 * n_ctx:
        raise UsageError(
            f"you need at least {2 * n_ctx} tokens to evaluate perplexity with a context of {n_ctx}; "
            f"the data file you provided tokenizes to only {len(tokens)} tokens",
            hint="use a longer text or a smaller --ctx-size (-c)")
    if add_bos and bos_id is None:
        raise UsageError("the vocabulary adds BOS but has no BOS token id")
    if n_chunks == 0:
        raise UsageError("--chunks 0 leaves nothing to evaluate")

    n_chunk_max = len(tokens) // n_ctx
    n_chunk = n_chunk_max if n_chunks < 0 else min(n_chunks, n_chunk_max)
    first = n_ctx // 2
    n_score = n_ctx - first - 1
    batch_size = min(n_batch, n_ctx) if n_batch > 0 else n_ctx
    emit(f"perplexity: calculating perplexity over {n_chunk} chunks, n_ctx={n_ctx}, "
         f"batch_size={batch_size}, n_seq=1\n")

    nll_sum = 0.0
    nll2_sum = 0.0
    count = 0
    running: list[float] = []
    for i in range(n_chunk):
        start = i * n_ctx
        chunk = [int(t) for t in tokens[start:start + n_ctx]]
        if add_bos:
            chunk[0] = int(bos_id)  # replaced, not inserted: the chunk stays n_ctx long
        t0 = time.perf_counter()
        logits = np.asarray(eval_chunk(chunk))
        if i == 0:
            emit(_eta_line(time.perf_counter() - t0, n_chunk))
        rows = _scored_rows(logits, n_ctx, first)
        targets = np.asarray(tokens[start + first + 1:start + n_ctx], dtype=np.int64)
        v = nll_of_rows(rows, targets)
        nll_sum += float(v.sum())
        nll2_sum += float((v * v).sum())
        count += n_score
        running.append(math.exp(nll_sum / count))
        emit(f"[{i + 1}]{running[-1]:.4f},")
    emit("\n")

    mean = nll_sum / count
    ppl = math.exp(mean)
    var = nll2_sum / count - mean * mean
    if var > 0 and count > 1:
        stderr = ppl * math.sqrt(var / (count - 1))
    else:
        stderr = 0.0
    result = PerplexityResult(ppl=ppl, stderr=stderr, chunk_ppls=running, n_tokens_scored=count, nll=mean)
    if var > 0 and count > 1:
        emit(format_final(result) + "\n")
    else:
        emit("Unexpected negative standard deviation of log(prob)\n")
    return result


def _scored_rows(logits: np.ndarray, n_ctx: int, first: int) -> np.ndarray:
    """Rows first ... n_ctx-2 of a chunk's logits (the last row has no next token to predict)."""
    if logits.ndim != 2:
        raise ValueError(f"eval_chunk must return a 2-D logits array, got shape {logits.shape}")
    if logits.shape[0] == n_ctx:
        return logits[first:n_ctx - 1]
    if logits.shape[0] == n_ctx - first:
        return logits[:-1]
    raise ValueError(f"eval_chunk returned {logits.shape[0]} rows; expected {n_ctx} or {n_ctx - first}")
