"""Tests for specjax.verify: exact output law by enumeration, plus behaviour and Monte-Carlo checks.

The exact-law tests integrate over ALL randomness analytically while running the real decision code:

* the draft tokens are enumerated (weight = product of the proposer's probabilities), or, for
  deterministic proposals, fixed by a guess function;
* the acceptance uniforms are integrated: ``chain_core`` accepts draft i iff ``u[i] < ratio[i]``, so
  for u ~ U[0, 1) "first rejection at n" has probability ``prod_{i<n} ratio[i] * (1 - ratio[n])``.
  For each n we run the real core with a u vector that realises that outcome (0 = accept, the float
  just below 1 = reject) and check that it does stop at n;
* the emitted token after the accepted prefix is integrated over the distribution the core returns
  (the public functions sample from exactly that distribution).

The law of the first T emitted tokens, across as many iterations as needed, is compared with the
target's autoregressive law over small conditional tables (context = last K tokens); it must agree
within 1e-6. Negative controls (deliberately wrong rules) must disagree by a clear margin.
"""

from __future__ import annotations

import collections
import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest, parameterized

from specjax import verify
from specjax.verify import rejection

try:
    from tests.stats_util import chi_square_pvalue
except ImportError:  # pragma: no cover - depends on how the tests are collected
    from stats_util import chi_square_pvalue

EXACT_TOL = 1e-6
CONTROL_MARGIN = 1e-3
U_ACCEPT = 0.0  # accepted iff ratio > 0
U_REJECT = float(np.nextafter(np.float32(1.0), np.float32(0.0)))  # rejected iff ratio < 1

KINDS = ("random", "equal", "disjoint", "q_subset", "p_topk", "close", "near_identical", "q_onehot")


# ----------------------------------------------------------------------------- distributions


def _norm32(x) -> np.ndarray:
    x = np.asarray(x, np.float64)
    return (x / x.sum()).astype(np.float32)


def make_pair(rng: np.random.Generator, v: int, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """A (p, q) pair of float32[V] distributions exercising one edge case."""

    def dense():
        return rng.gamma(0.8, size=v) + 1e-3

    def subset_mask():  # a random non-empty strict subset of the vocabulary
        mask = np.zeros(v)
        mask[rng.permutation(v)[: rng.integers(1, v)]] = 1.0
        return mask

    if kind == "random":
        return _norm32(dense()), _norm32(dense())
    if kind == "equal":
        p = _norm32(dense())
        return p, p.copy()
    if kind == "disjoint":
        mask = subset_mask()
        return _norm32(dense() * mask), _norm32(dense() * (1 - mask))
    if kind == "q_subset":  # q(x) = 0 where p(x) > 0
        return _norm32(dense()), _norm32(dense() * subset_mask())
    if kind == "p_topk":  # target truncated top-k style: zeros in p
        p = dense()
        k = rng.integers(1, v)
        p[np.argsort(-p)[k:]] = 0.0
        return _norm32(p), _norm32(dense())
    if kind == "close":  # small but real residual (~1e-4): catches a too-large round-off threshold
        p = dense()
        return _norm32(p), _norm32(p * (1.0 + 1e-3 * rng.standard_normal(v)))
    if kind == "near_identical":  # equal up to float32 round-off
        p = dense()
        return _norm32(p), _norm32(p * (1.0 + 1e-6 * rng.standard_normal(v)))
    if kind == "q_onehot":
        return _norm32(dense()), _norm32(np.eye(v)[rng.integers(v)])
    raise ValueError(kind)


class ToyLM:
    """Target and draft conditional tables over V tokens with a context of the last K tokens."""

    def __init__(self, seed: int, v: int, k: int, kinds=KINDS):
        rng = np.random.default_rng(seed)
        self.v, self.k = v, k
        shape = (v + 1,) * k  # index v = "no token yet" padding
        self.p = np.zeros(shape + (v,), np.float32)
        self.q = np.zeros(shape + (v,), np.float32)
        for idx in itertools.product(range(v + 1), repeat=k):
            self.p[idx], self.q[idx] = make_pair(rng, v, kinds[rng.integers(len(kinds))])

    def key(self, ctx: tuple) -> tuple:
        if self.k == 0:
            return ()
        padded = (self.v,) * self.k + tuple(ctx)
        return padded[-self.k :]

    def target(self, ctx) -> np.ndarray:
        return self.p[self.key(ctx)]

    def draft(self, ctx) -> np.ndarray:
        return self.q[self.key(ctx)]

    def exact_law(self, t: int) -> dict:
        """Autoregressive law of the first t tokens from the empty context (float64)."""
        law = {}
        for seq in itertools.product(range(self.v), repeat=t):
            prob = 1.0
            for i, tok in enumerate(seq):
                prob *= float(self.target(seq[:i])[tok])
            law[seq] = prob
        return law


# ----------------------------------------------------------------------------- enumeration


def real_sampled_core(u, p, q, x):
    return verify.chain_core(u, p, q, x)


def real_deterministic_core(u, p, q, x):
    del q  # deterministic proposals are verified against one-hot q, built by the library
    return rejection.deterministic_core(u, p, x)


@functools.lru_cache(maxsize=None)
def _batched(core_fn):
    return jax.jit(jax.vmap(core_fn))


class Enumerator:
    """Exact law of emitted tokens under a chain verifier, computed through `core_fn`."""

    def __init__(self, lm: ToyLM, gamma: int, core_fn, guess=None):
        self.lm, self.gamma, self.core_fn, self.guess = lm, gamma, core_fn, guess
        self._memo = {}

    def _drafts(self, ctx):
        g, v = self.gamma, self.lm.v
        if self.guess is not None:
            return [(self.guess(self.lm, ctx, g), 1.0)]
        drafts = []
        for x in itertools.product(range(v), repeat=g):
            w = 1.0
            for i in range(g):
                w *= float(self.lm.draft(ctx + x[:i])[x[i]])
            drafts.append((x, w))  # zero-weight drafts kept so batch shapes stay static
        return drafts

    def iteration(self, ctx: tuple) -> dict:
        """Law of the tokens emitted by ONE verification iteration from `ctx`."""
        g = self.gamma
        drafts = self._drafts(ctx)
        us, ps, qs, xs, meta = [], [], [], [], []
        for x, w in drafts:
            p = np.stack([self.lm.target(ctx + x[:i]) for i in range(g + 1)])
            q = np.stack([self.lm.draft(ctx + x[:i]) for i in range(g)])
            for n in range(g + 1):
                us.append([U_ACCEPT] * n + [U_REJECT] * (n < g) + [U_ACCEPT] * (g - n - 1))
                ps.append(p)
                qs.append(q)
                xs.append(x)
                meta.append((x, w, n))
        out = _batched(self.core_fn)(
            jnp.asarray(np.array(us, np.float32)),
            jnp.asarray(np.array(ps)),
            jnp.asarray(np.array(qs)),
            jnp.asarray(np.array(xs, np.int32)),
        )
        num_accepted = np.asarray(out.num_accepted)
        next_dist = np.asarray(out.next_dist, np.float64)
        ratio = np.asarray(out.accept_ratio, np.float64)
        assert np.all(np.isfinite(next_dist)) and np.all(np.isfinite(ratio))
        law = collections.defaultdict(float)
        for j, (x, w, n) in enumerate(meta):
            weight = w * np.prod(ratio[j, :n]) * ((1.0 - ratio[j, n]) if n < g else 1.0)
            if weight <= 0.0:
                continue
            assert num_accepted[j] == n, (x, n, num_accepted[j], ratio[j])
            for y in np.flatnonzero(next_dist[j] > 0):
                law[tuple(x[:n]) + (int(y),)] += weight * next_dist[j, y]
        return law

    def law(self, t: int, ctx: tuple = ()) -> dict:
        """Law of the first t emitted tokens from `ctx`, over as many iterations as needed."""
        memo_key = (self.lm.key(ctx), t)
        if memo_key in self._memo:
            return self._memo[memo_key]
        law = collections.defaultdict(float)
        for emitted, w in self.iteration(ctx).items():
            if len(emitted) >= t:
                law[emitted[:t]] += w
            else:
                for rest, w2 in self.law(t - len(emitted), ctx + emitted).items():
                    law[emitted + rest] += w * w2
        self._memo[memo_key] = law
        return law


def max_law_diff(law: dict, expected: dict) -> float:
    keys = set(law) | set(expected)
    return max(abs(law.get(k, 0.0) - expected.get(k, 0.0)) for k in keys)


def argmax_guess(lm: ToyLM, ctx: tuple, g: int) -> tuple:
    """A deterministic proposal: greedy chain of the draft table (no sampling)."""
    x = ()
    for _ in range(g):
        x += (int(np.argmax(lm.draft(ctx + x))),)
    return x


def table_guess(lm: ToyLM, ctx: tuple, g: int) -> tuple:
    """Another deterministic proposal, often of target-excluded tokens: argmin of the target."""
    x = ()
    for _ in range(g):
        x += (int(np.argmin(lm.target(ctx + x))),)
    return x


# Negative controls: deliberately wrong rules built around the real core.
def control_accept_always(u, p, q, x):
    core = verify.chain_core(jnp.full_like(u, -1.0), p, q, x)
    return core._replace(accept_ratio=jnp.ones_like(core.accept_ratio))


def control_residual_is_p(u, p, q, x):
    core = verify.chain_core(u, p, q, x)
    return core._replace(next_dist=p[core.num_accepted])


def control_bonus_from_previous_position(u, p, q, x):
    core = verify.chain_core(u, p, q, x)
    g = x.shape[0]
    return core._replace(next_dist=jnp.where(core.num_accepted == g, p[g - 1], core.next_dist))


def control_residual_not_renormalised(u, p, q, x):
    core = verify.chain_core(u, p, q, x)
    g = x.shape[0]
    stop = jnp.minimum(core.num_accepted, g - 1)
    r = jnp.maximum(p[stop] - q[stop], 0.0)  # (p - q)+ taken as the law itself
    return core._replace(next_dist=jnp.where(core.num_accepted < g, r, core.next_dist))


def control_soft_q_for_guess(u, p, q, x):
    return verify.chain_core(u, p, q, x)  # verifies an argmax guess against the soft draft law


# ----------------------------------------------------------------------------- tests

# Many keys, one row: jitted (eager vmap dispatch is slow on small CPUs).
_KEYS_ONLY_REJECTION = jax.jit(jax.vmap(verify.rejection_chain, in_axes=(0, None, None, None)))
_KEYS_ONLY_DETERMINISTIC = jax.jit(jax.vmap(verify.deterministic_chain, in_axes=(0, None, None)))
_REJECTION = jax.jit(verify.rejection_chain)
_DETERMINISTIC = jax.jit(verify.deterministic_chain)


class ExactLawTest(parameterized.TestCase):
    @parameterized.product(kind=KINDS, v=(3, 6))
    def test_single_step_law(self, kind, v):
        rng = np.random.default_rng([KINDS.index(kind), v])  # the same in every process
        for _ in range(3):
            lm = ToyLM(0, v, 0)
            lm.p[()], lm.q[()] = make_pair(rng, v, kind)
            law = Enumerator(lm, 1, real_sampled_core).law(1)
            self.assertLess(max_law_diff(law, lm.exact_law(1)), EXACT_TOL)

    @parameterized.parameters(
        dict(gamma=1, v=5, k=3, t=3),
        dict(gamma=2, v=4, k=2, t=3),
        dict(gamma=4, v=3, k=2, t=6),  # the bonus (t = 5) and the next iteration (t = 6)
        dict(gamma=4, v=4, k=1, t=5),
    )
    def test_chain_law(self, gamma, v, k, t):
        lm = ToyLM(seed=gamma * 100 + v, v=v, k=k)
        law = Enumerator(lm, gamma, real_sampled_core).law(t)
        self.assertAlmostEqual(sum(law.values()), 1.0, delta=EXACT_TOL)
        self.assertLess(max_law_diff(law, lm.exact_law(t)), EXACT_TOL)

    @parameterized.parameters(
        dict(gamma=1, v=5, k=3, t=3, guess=argmax_guess),
        dict(gamma=2, v=4, k=2, t=3, guess=argmax_guess),
        dict(gamma=4, v=4, k=2, t=6, guess=argmax_guess),
        dict(gamma=2, v=4, k=2, t=3, guess=table_guess),
    )
    def test_deterministic_chain_law(self, gamma, v, k, t, guess):
        lm = ToyLM(seed=7 + gamma, v=v, k=k)
        law = Enumerator(lm, gamma, real_deterministic_core, guess=guess).law(t)
        self.assertLess(max_law_diff(law, lm.exact_law(t)), EXACT_TOL)

    @parameterized.named_parameters(
        ("accept_always", control_accept_always, None),
        ("residual_is_p", control_residual_is_p, None),
        ("bonus_from_previous_position", control_bonus_from_previous_position, None),
        ("residual_not_renormalised", control_residual_not_renormalised, None),
        ("soft_q_for_deterministic_guess", control_soft_q_for_guess, argmax_guess),
    )
    def test_negative_controls_detected(self, control, guess):
        lm = ToyLM(seed=3, v=4, k=2, kinds=("random", "p_topk", "q_subset", "disjoint"))
        good_core = real_sampled_core if guess is None else real_deterministic_core
        # gamma 2, 4 tokens: the bonus (token 3) and the next iteration (token 4) are in the law.
        good = Enumerator(lm, 2, good_core, guess=guess).law(4)
        bad = Enumerator(lm, 2, control, guess=guess).law(4)
        self.assertLess(max_law_diff(good, lm.exact_law(4)), EXACT_TOL)
        self.assertGreater(max_law_diff(bad, lm.exact_law(4)), CONTROL_MARGIN)


class RuleTest(parameterized.TestCase):
    def test_acceptance_ratio_edge_cases(self):
        p = jnp.array([0.3, 0.0, 0.2, 0.0, 0.5], jnp.float32)
        q = jnp.array([0.6, 0.4, 0.0, 0.0, 0.5], jnp.float32)
        ratio = np.asarray(verify.acceptance_ratio(p, q))
        np.testing.assert_allclose(ratio, [0.5, 0.0, 1.0, 0.0, 1.0])

    def test_residual(self):
        p = jnp.array([0.5, 0.3, 0.2, 0.0], jnp.float32)
        np.testing.assert_allclose(verify.residual(p, jnp.array([0.7, 0.1, 0.0, 0.2])), [0, 0.5, 0.5, 0], atol=1e-6)
        np.testing.assert_array_equal(verify.residual(p, p), p)  # empty residual -> p
        # Round-off residual: tiny but non-empty, still a finite normalized distribution.
        q = p.at[0].add(-1e-7).at[1].add(1e-7)
        r = np.asarray(verify.residual(p, q))
        self.assertTrue(np.all(np.isfinite(r)))
        np.testing.assert_allclose(r, [1, 0, 0, 0])
        # Below the smallest normal float32 the residual counts as empty.
        self.assertTrue(np.all(np.isfinite(verify.residual(p, p - 1e-45))))

    def test_accept_prob_is_beta(self):
        rng = np.random.default_rng(0)
        g, v = 3, 6
        pairs = [make_pair(rng, v, k) for k in ("random", "disjoint", "equal")]
        p = np.stack([a for a, _ in pairs] + [_norm32(rng.random(v))])
        q = np.stack([b for _, b in pairs])
        x = jnp.array([0, 1, 2])
        verdict = _REJECTION(jax.random.key(0), p, q, x)
        np.testing.assert_allclose(verdict.accept_prob, np.minimum(p[:g], q).sum(-1), atol=1e-6)
        np.testing.assert_allclose(verdict.accept_prob[1:], [0.0, 1.0], atol=1e-6)
        det = _DETERMINISTIC(jax.random.key(0), p, x)
        np.testing.assert_allclose(det.accept_prob, p[np.arange(g), [0, 1, 2]], atol=1e-7)

    def test_q_zero_draft_token_no_nan(self):
        # Drafted tokens the proposer gives zero mass: accepted iff p(x) > 0, never NaN.
        p = jnp.array([[0.5, 0.5, 0.0, 0.0], [0.2, 0.0, 0.8, 0.0], [0.1, 0.2, 0.7, 0.0]], jnp.float32)
        q = jnp.array([[0.0, 1.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0]], jnp.float32)
        keys = jax.random.split(jax.random.key(1), 512)
        x = jnp.array([0, 2])  # q(x) = 0 at both; p_0(0) > 0, p_1(2) > 0
        out = _KEYS_ONLY_REJECTION(keys, p, q, x)
        np.testing.assert_array_equal(out.num_accepted, 2)
        x = jnp.array([2, 0])  # p_0(2) = 0: never accepted; residual (p - q)+ = [0.5, 0, 0, 0]
        out = _KEYS_ONLY_REJECTION(keys, p, q, x)
        np.testing.assert_array_equal(out.num_accepted, 0)
        np.testing.assert_array_equal(out.next_token, 0)
        self.assertTrue(np.all(np.isfinite(out.accept_prob)))

    def test_never_emits_zero_probability_token(self):
        # Empty residual (p == q) and top-k zeros: the emitted token always has p > 0.
        p = jnp.array([[0.0, 0.6, 0.4, 0.0]] * 3, jnp.float32)
        keys = jax.random.split(jax.random.key(2), 512)
        for q in (p[:2], jnp.array([[0.25] * 4] * 2, jnp.float32)):
            for x in (jnp.array([1, 2]), jnp.array([0, 3])):
                out = _KEYS_ONLY_REJECTION(keys, p, q, x)
                self.assertTrue(np.all(np.asarray(p[0])[np.asarray(out.next_token)] > 0))
        out = _KEYS_ONLY_DETERMINISTIC(keys, p, jnp.array([3, 1]))
        np.testing.assert_array_equal(out.num_accepted, 0)
        self.assertTrue(np.all(np.asarray(p[0])[np.asarray(out.next_token)] > 0))

    def test_deterministic_certain_token_always_accepted(self):
        p = jnp.array([[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0], [0.2, 0.3, 0.5, 0.0]], jnp.float32)
        keys = jax.random.split(jax.random.key(3), 512)
        out = _KEYS_ONLY_DETERMINISTIC(keys, p, jnp.array([1, 2]))
        np.testing.assert_array_equal(out.num_accepted, 2)
        self.assertTrue(np.all(np.isin(out.next_token, [0, 1, 2])))

    def test_gamma_zero(self):
        p = jnp.array([[0.0, 0.0, 1.0]], jnp.float32)
        out = _REJECTION(jax.random.key(0), p, jnp.zeros((0, 3)), jnp.zeros((0,), jnp.int32))
        self.assertEqual(int(out.num_accepted), 0)
        self.assertEqual(int(out.next_token), 2)

    def test_shape_validation(self):
        p, q, x = jnp.ones((3, 4)) / 4, jnp.ones((2, 4)) / 4, jnp.array([0, 1])
        with self.assertRaisesRegex(ValueError, "p must be"):
            verify.rejection_chain(jax.random.key(0), p[:2], q, x)
        with self.assertRaisesRegex(ValueError, "q must be"):
            verify.rejection_chain(jax.random.key(0), p, q[:, :3], x)
        with self.assertRaisesRegex(ValueError, "target_argmax"):
            verify.greedy_chain(jnp.array([0, 1]), x)


class GreedyTest(parameterized.TestCase):
    @parameterized.named_parameters(
        ("all_match_bonus", [3, 1, 4, 2], [3, 1, 4], 3, 2, [1, 1, 1]),
        ("first_mismatch", [3, 1, 4, 2], [0, 1, 4], 0, 3, [0, 1, 1]),
        ("middle_mismatch", [3, 1, 4, 2], [3, 0, 4], 1, 1, [1, 0, 1]),
        ("last_mismatch", [3, 1, 4, 2], [3, 1, 0], 2, 4, [1, 1, 0]),
    )
    def test_cases(self, argmax, draft, n, token, accept):
        out = jax.jit(verify.greedy_chain)(jnp.array(argmax), jnp.array(draft))
        self.assertEqual(int(out.num_accepted), n)
        self.assertEqual(int(out.next_token), token)
        np.testing.assert_array_equal(out.accept_prob, np.array(accept, np.float32))

    def test_matches_greedy_decoding(self):
        # Emitted tokens = the greedy tokens of the target, token for token.
        lm = ToyLM(seed=11, v=4, k=2)
        ctx = ()
        for _ in range(6):
            draft = argmax_guess(lm, ctx, 3)
            argmax = [int(np.argmax(lm.target(ctx + draft[:i]))) for i in range(4)]
            out = verify.greedy_chain(jnp.array(argmax), jnp.array(draft))
            emitted = draft[: int(out.num_accepted)] + (int(out.next_token),)
            for tok in emitted:
                self.assertEqual(tok, int(np.argmax(lm.target(ctx))))
                ctx += (tok,)


class BatchAndSamplingTest(parameterized.TestCase):
    def test_jit_vmap_per_row_keys(self):
        rng = np.random.default_rng(5)
        b, g, v = 6, 3, 6  # g, v as in test_accept_prob_is_beta: shares compiled _REJECTION
        p = jnp.asarray(np.stack([[_norm32(rng.random(v)) for _ in range(g + 1)] for _ in range(b)]))
        q = jnp.asarray(np.stack([[_norm32(rng.random(v)) for _ in range(g)] for _ in range(b)]))
        x = jnp.asarray(rng.integers(0, v, (b, g)), jnp.int32)
        keys = jax.random.split(jax.random.key(0), b)
        batched_fn = jax.jit(jax.vmap(verify.rejection_chain))
        batched = batched_fn(keys, p, q, x)
        perm = np.array([3, 0, 5, 1, 4, 2])
        permuted = batched_fn(keys[perm], p[perm], q[perm], x[perm])  # same key -> same output
        for i in range(b):
            single = _REJECTION(keys[i], p[i], q[i], x[i])
            self.assertEqual(int(batched.num_accepted[i]), int(single.num_accepted))
            self.assertEqual(int(batched.next_token[i]), int(single.next_token))
            np.testing.assert_allclose(batched.accept_prob[i], single.accept_prob, rtol=1e-6)
        np.testing.assert_array_equal(permuted.next_token, batched.next_token[perm])
        det = jax.jit(jax.vmap(verify.deterministic_chain))(keys, p, x)
        self.assertEqual(det.num_accepted.shape, (b,))
        greedy = jax.jit(jax.vmap(verify.greedy_chain))(jnp.argmax(p, -1), x)
        self.assertEqual(greedy.accept_prob.shape, (b, g))

    def test_monte_carlo_first_tokens(self):
        # Public path: x_i ~ q_i, rejection_chain; context-free rows, so the first emitted token
        # follows p_0 and, given the first draft was accepted, the second emitted token follows p_1.
        rng = np.random.default_rng(9)
        v, g, n = 5, 2, 4000
        p = jnp.asarray(np.stack([_norm32(rng.gamma(0.8, size=v)) for _ in range(g + 1)]))
        q = jnp.asarray(np.stack([_norm32(rng.gamma(0.8, size=v)) for _ in range(g)]))

        @jax.jit
        def run(key):
            k_draft, k_verify = jax.random.split(key)
            x = jax.random.categorical(k_draft, jnp.log(q)).astype(jnp.int32)  # int32[G]
            out = verify.rejection_chain(k_verify, p, q, x)
            first = jnp.where(out.num_accepted >= 1, x[0], out.next_token)
            second = jnp.where(out.num_accepted >= 2, x[1], out.next_token)
            return x, out.num_accepted, first, second

        x, acc, first, second = map(np.asarray, jax.vmap(run)(jax.random.split(jax.random.key(42), n)))
        self.assertGreater(chi_square_pvalue(np.bincount(first, minlength=v), p[0]), 1e-6)
        has_second = acc >= 1
        self.assertGreater(chi_square_pvalue(np.bincount(second[has_second], minlength=v), p[1]), 1e-6)
        # Acceptance rate of the first draft matches beta_0.
        beta0 = float(np.minimum(p[0], q[0]).sum())
        self.assertLess(abs(has_second.mean() - beta0), 5 * np.sqrt(beta0 * (1 - beta0) / n) + 1e-3)
        # Negative control: emitting the draft unconditionally follows q_0, which the test rejects.
        self.assertLess(chi_square_pvalue(np.bincount(x[:, 0], minlength=v), p[0]), 1e-6)


if __name__ == "__main__":
    absltest.main()
