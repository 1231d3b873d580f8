"""Training data the executor can build offline, and a user's own tokens.

Both sources are indexed by global sample number, so every layout (and a resumed run) sees exactly the same
sequences in the same order: step ``s`` uses samples ``s * global_batch`` to ``(s + 1) * global_batch - 1``,
data-parallel rank ``d`` takes its contiguous share, and micro-batches follow in order.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from costmodel.profiles import InputError


class SyntheticTask:
    """A learnable sequence task: each token is followed by a fixed successor (a random permutation of the
    vocabulary) with probability ``p_follow``, otherwise by a uniformly random token. A model that learns the
    successor table reaches a loss near the task's entropy, far below log(vocab)."""

    def __init__(self, vocab: int, seq_len: int, *, seed: int = 1234, p_follow: float = 0.85):
        self.vocab, self.seq_len, self.seed, self.p_follow = vocab, seq_len, seed, p_follow
        self.successor = np.random.default_rng(seed).permutation(vocab)

    def entropy_nats(self) -> float:
        """Per-token entropy of the next token given the previous one (the best achievable loss)."""
        p_succ = self.p_follow + (1 - self.p_follow) / self.vocab
        p_other = (1 - self.p_follow) / self.vocab
        return float(-(p_succ * np.log(p_succ) + (self.vocab - 1) * p_other * np.log(p_other)))

    def sample(self, index: int) -> np.ndarray:
        """Tokens of sample ``index``: ``seq_len + 1`` ids (inputs and shifted labels)."""
        rng = np.random.default_rng((self.seed, index))
        n = self.seq_len + 1
        follow = rng.random(n) < self.p_follow
        noise = rng.integers(0, self.vocab, n)
        out = np.empty(n, dtype=np.int64)
        out[0] = noise[0]
        for t in range(1, n):
            out[t] = self.successor[out[t - 1]] if follow[t] else noise[t]
        return out


class TokenFile:
    """A user's tokenised corpus: a 1-D ``.npy`` array or a raw binary file of ``dtype`` token ids.
    Sample ``i`` is the window starting at ``(i * seq_len) mod (n - seq_len - 1)``."""

    def __init__(self, path: str, seq_len: int, *, vocab: int, dtype: str = "uint16"):
        p = Path(path)
        if not p.exists():
            raise InputError(f"{path}: data file not found (give a .npy array or a raw .bin of {dtype} token ids)")
        try:
            self.tokens = np.load(p, mmap_mode="r") if p.suffix == ".npy" else np.memmap(p, dtype=dtype, mode="r")
        except ValueError as e:
            raise InputError(f"{path}: not a token array ({e})") from None
        if self.tokens.ndim != 1 or len(self.tokens) < seq_len + 2:
            raise InputError(f"{path}: need a 1-D array of at least seq_len + 2 = {seq_len + 2} tokens, "
                             f"got shape {self.tokens.shape}")
        top = int(np.max(self.tokens[: min(len(self.tokens), 1 << 20)]))
        if top >= vocab:
            raise InputError(f"{path}: token id {top} is outside the model's vocabulary of {vocab}")
        self.seq_len = seq_len

    def sample(self, index: int) -> np.ndarray:
        span = len(self.tokens) - self.seq_len - 1
        start = (index * self.seq_len) % span
        return np.asarray(self.tokens[start: start + self.seq_len + 1], dtype=np.int64)


def microbatches(source, *, step: int, global_batch: int, dp: int, dp_rank: int, micro_batch: int):
    """Yield (tokens, labels) numpy arrays of shape [micro_batch, seq_len] for one step on one dp rank."""
    per_rank = global_batch // dp
    first = step * global_batch + dp_rank * per_rank
    for m in range(per_rank // micro_batch):
        rows = np.stack([source.sample(first + m * micro_batch + i) for i in range(micro_batch)])
        yield rows[:, :-1], rows[:, 1:]
