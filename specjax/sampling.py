"""Next-token sampling with Hugging Face `generate` semantics.

Why this module exists: speculative decoding is only *lossless* if it preserves
the exact distribution the target model would sample from on its own. Every
proposer and verifier in specjax therefore takes the target law from
`probabilities`, and `sample` draws from that same law. Pinning the law to
what `transformers` does (`TemperatureLogitsWarper` -> `TopKLogitsWarper` ->
`TopPLogitsWarper`, the order `generate` applies them) lets outputs be compared
token for token with the reference implementation.

Semantics, including the corners:

* temperature: `logits / temperature` in float32 (a division, as HF does, not a
  multiplication by the reciprocal, so rounding matches). Temperature 0 means
  greedy: `argmax`, ties resolved to the lowest token id.
* top-k: every token strictly below the k-th largest value is removed, so all
  tokens *tied* with the k-th value are kept (more than k may survive).
  `top_k >= V` keeps everything. If fewer than k logits are finite, the k-th
  value is -inf and nothing more is removed.
* top-p: sort ascending, cumulative softmax, remove where `cumsum <= 1 - top_p`,
  always keep the last (most probable) sorted token. This is order dependent
  when tokens are tied across the cut: some members of a tie are kept and
  others removed. We use a stable ascending sort, so among tied tokens the
  lower ids are removed first (and with a tiny top_p and a tie at the maximum,
  the *highest* tied id survives, unlike greedy). HF calls torch's default,
  unstable sort, so its own choice at such a tie is implementation defined (on
  CPU it was observed stable only for V <= 16). We match HF exactly when its
  sort is stable (`torch.sort(..., stable=True)`, or V <= 16 on CPU), and
  otherwise up to which members of a straddling tie survive.
  -inf entries sort first with probability 0 and stay removed. The cumulative
  sum is float32 here while torch on CPU accumulates in float64, so a token
  whose cumsum is within ~1e-6 of `1 - top_p` may be decided differently.
* Removed entries are -inf. Rows whose logits are all -inf, or contain NaN,
  are a caller bug: the results are NaN / arbitrary and are not repaired here.

All functions take `sampling` as a static (hashable) argument under `jax.jit`,
accept any leading batch dimensions, and compute in float32.
"""

from __future__ import annotations

import dataclasses
import math
import operator

import jax
import jax.numpy as jnp

__all__ = [
    "Sampling",
    "warp_logits",
    "probabilities",
    "greedy",
    "sample",
    "sample_from_probs",
]


@dataclasses.dataclass(frozen=True)
class Sampling:
    """Sampling hyper-parameters (hashable, so usable as a static jit argument).

    Attributes:
      temperature: >= 0 and finite; 0 means greedy decoding.
      top_k: keep tokens >= the k-th largest logit; 0 disables.
      top_p: nucleus mass in (0, 1]; 1.0 disables.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        t, k, p = self.temperature, self.top_k, self.top_p
        try:
            t = float(t)
        except (TypeError, ValueError):
            raise ValueError(f"temperature must be a real number, got {t!r}") from None
        if not math.isfinite(t):
            raise ValueError(f"temperature must be finite, got {t}")
        if t < 0:
            raise ValueError(f"temperature must be >= 0, got {t}")
        try:  # accepts Python/numpy integers; rejects floats and bools
            if isinstance(k, bool):
                raise TypeError
            k = operator.index(k)
        except TypeError:
            raise ValueError(f"top_k must be an int, got {k!r}") from None
        if k < 0:
            raise ValueError(f"top_k must be >= 0, got {k}")
        try:
            p = float(p)
        except (TypeError, ValueError):
            raise ValueError(f"top_p must be a real number, got {p!r}") from None
        if not 0.0 < p <= 1.0:  # also rejects NaN
            raise ValueError(f"top_p must be in (0, 1], got {p}")
        # Normalise types so equal settings hash equally (e.g. numpy scalars).
        object.__setattr__(self, "temperature", t)
        object.__setattr__(self, "top_k", k)
        object.__setattr__(self, "top_p", p)

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0


def _top_k(logits: jax.Array, k: int) -> jax.Array:
    """float32[..., V] -> float32[..., V]; keeps ties with the k-th value."""
    k = min(k, logits.shape[-1])
    kth = jax.lax.top_k(logits, k)[0][..., -1:]  # float32[..., 1]
    return jnp.where(logits < kth, -jnp.inf, logits)


def _top_p(logits: jax.Array, top_p: float) -> jax.Array:
    """float32[..., V] -> float32[..., V]; HF TopPLogitsWarper, stable sort."""
    iota = jax.lax.broadcasted_iota(jnp.int32, logits.shape, logits.ndim - 1)
    # Ascending, stable: tied tokens keep id order. float32[..., V], int32[..., V]
    sorted_logits, order = jax.lax.sort((logits, iota), num_keys=1, is_stable=True)
    cumulative = jnp.cumsum(jax.nn.softmax(sorted_logits, axis=-1), axis=-1)
    # Python-double threshold, compared in float32 (as torch does with a scalar).
    remove_sorted = (cumulative <= 1.0 - top_p).at[..., -1].set(False)
    remove = jnp.put_along_axis(
        jnp.zeros(logits.shape, bool), order, remove_sorted, axis=-1, inplace=False
    )
    return jnp.where(remove, -jnp.inf, logits)


def warp_logits(logits: jax.Array, sampling: Sampling) -> jax.Array:
    """Applies temperature, then top-k, then top-p.

    Args:
      logits: float[..., V] (any float dtype; cast to float32).
      sampling: static sampling settings.

    Returns:
      float32[..., V] with removed entries set to -inf. For greedy settings
      the logits are returned unchanged (callers use `greedy`).
    """
    logits = jnp.asarray(logits, jnp.float32)
    if sampling.is_greedy:
        return logits
    if sampling.temperature != 1.0:
        logits = logits / sampling.temperature
    if sampling.top_k > 0:
        logits = _top_k(logits, sampling.top_k)
    if sampling.top_p < 1.0:  # skipping avoids a full sort over the vocabulary
        logits = _top_p(logits, sampling.top_p)
    return logits


def probabilities(logits: jax.Array, sampling: Sampling) -> jax.Array:
    """The warped next-token law that speculative methods must preserve.

    Args:
      logits: float[..., V].
      sampling: static sampling settings.

    Returns:
      float32[..., V]: softmax of `warp_logits`; for greedy settings
      `one_hot(greedy(logits))`.
    """
    if sampling.is_greedy:
        return jax.nn.one_hot(greedy(logits), logits.shape[-1], dtype=jnp.float32)
    return jax.nn.softmax(warp_logits(logits, sampling), axis=-1)


def greedy(logits: jax.Array) -> jax.Array:
    """float[..., V] -> int32[...]: argmax; ties go to the lowest token id.

    `jnp.argmax` returns the first maximal index, like `torch.argmax`.
    """
    return jnp.argmax(jnp.asarray(logits, jnp.float32), axis=-1).astype(jnp.int32)


def sample(key: jax.Array | None, logits: jax.Array, sampling: Sampling) -> jax.Array:
    """Draws one token per row from `probabilities(logits, sampling)`.

    Args:
      key: PRNG key; may be None when `sampling.is_greedy`.
      logits: float[..., V].
      sampling: static sampling settings.

    Returns:
      int32[...] token ids.
    """
    if sampling.is_greedy:
        return greedy(logits)
    return sample_from_probs(key, probabilities(logits, sampling))


def _block_size(vocab: int) -> int:
    return math.isqrt(vocab - 1) + 1 if vocab > 1 else 1  # ceil(sqrt(V))


def sample_from_probs(key: jax.Array, probs: jax.Array) -> jax.Array:
    """Draws one token per row from an explicit probability vector.

    Used by verifiers for residual draws. Zero entries are never drawn. Rows
    need not be normalised, but must be non-negative with a positive sum.

    Two exact Gumbel-max draws: a block of ~sqrt(V) consecutive tokens with
    probability proportional to its mass, then a token within that block, so
    P(token) = P(block) P(token | block) = p[token] / sum(p). That takes ~2 sqrt(V)
    random numbers instead of V (one per token), which is what sampling cost on
    CPU, where generating them dominated a small model's decoding step. The only
    added rounding is the float32 sum of <= sqrt(V) entries per block (relative
    error below sqrt(V) x 6e-8: 3e-6 for V = 2048, 2e-5 for V = 128k), so tiny
    probabilities keep their relative accuracy, unlike inverse-CDF sampling over
    a float32 cumulative sum of the whole vocabulary.

    Args:
      key: PRNG key.
      probs: float[..., V].

    Returns:
      int32[...] token ids.
    """
    probs = jnp.asarray(probs, jnp.float32)
    vocab = probs.shape[-1]
    block = _block_size(vocab)
    blocks = -(-vocab // block)
    pad = [(0, 0)] * (probs.ndim - 1) + [(0, blocks * block - vocab)]
    p = jnp.pad(probs, pad).reshape(*probs.shape[:-1], blocks, block)  # zero padding: never drawn
    key_block, key_token = jax.random.split(key)
    b = jax.random.categorical(key_block, jnp.log(p.sum(-1)), axis=-1)  # log(0) = -inf
    within = jnp.take_along_axis(p, b[..., None, None], axis=-2)[..., 0, :]  # float32[..., block]
    t = jax.random.categorical(key_token, jnp.log(within), axis=-1)
    return (b * block + t).astype(jnp.int32)
