"""Fenchel-Young losses (Blondel, Martins, Niculae 2020) and the entmax names.

References: the gradient identity $\\nabla_z L = \\rho^*(z) - y$ (Danskin) by autodiff and by
central finite differences; optax's softmax cross-entropy for Shannon; the `entmax` package
(optional, like tests/test_entmax.py) for Tsallis, sparsemax and 1.5-entmax.
"""

import functools as ft

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fisherdyn as fd
from helpers import RUN_ONCE
from fisherdyn import (
    entmax,
    entmax15,
    entmax15_loss,
    entmax_loss,
    fenchel_young_loss,
    sparsemax,
    sparsemax_loss,
)

FAMILIES = {
    "shannon": fd.Shannon(),
    "tsallis1.5": fd.Tsallis(1.5),
    "tsallis2": fd.Tsallis(2.0),
    "kaniadakis0.3": fd.Kaniadakis(0.3),
    "burg": fd.Burg(),
    "abe1.5": fd.Abe(1.5),
    "renyi2": fd.Renyi(2.0),
    "sharma_mittal2,1.5": fd.SharmaMittal(2.0, 1.5),
}
RNG = np.random.default_rng(20251201)
B, N = 4, 7
Z = jnp.asarray(RNG.normal(size=(B, N)) * np.array([0.3, 1.0, 2.0, 4.0])[:, None])
# dense targets (Burg's Omega is infinite on the simplex's boundary)
Y = jax.nn.softmax(jnp.asarray(RNG.normal(size=(B, N)) * 1.5), axis=-1)
LABELS = jnp.asarray(RNG.integers(0, N, size=B))
T0 = 0.8


@ft.partial(eqx.filter_jit, **RUN_ONCE)
def _probe(entropy, z, y, T):
    """(L, dL/dz, dL/dT, rho*) in one compiled program per family: compiles dominate the
    runtime of these small problems, and RUN_ONCE compiles faster to the same numbers."""
    f = lambda z, T: (lambda L: (L.sum(), L))(fenchel_young_loss(entropy, z, y, T))
    (gz, gT), L = jax.grad(f, argnums=(0, 1), has_aux=True)(z, T)
    return L, gz, gT, fd.stationary(entropy, z, T)


@pytest.mark.parametrize("name", FAMILIES)
def test_gradient_identity(name):
    # Autodiff of the loss against the closed forms rho*(z) - y and S(rho*) - S(y); the
    # custom_jvp makes these the same numbers up to a few ulps (tolerance 1e-12).
    entropy = FAMILIES[name]
    T = jnp.asarray(T0)
    L, gz, gT, rho = _probe(entropy, Z, Y, T)
    np.testing.assert_allclose(gz, rho - Y, rtol=0, atol=1e-12)
    dT = jnp.sum(entropy.value(rho) - entropy.value(Y))
    np.testing.assert_allclose(gT, dT, rtol=1e-12, atol=1e-12)
    # Central differences in float64 with h = 1e-5: truncation ~h^2 |L'''| ~ 1e-10 and
    # round-off ~eps |L| / h ~ 1e-11 (solver residuals are ~1e-14); tolerance 1e-7 relative
    # to the gradient's size, so a sign or convention error (O(1)) cannot pass.
    f = lambda z, T: float(_probe(entropy, z, Y, jnp.asarray(T))[0].sum())
    h = 1e-5
    for d in RNG.normal(size=(2, B, N)):
        d = jnp.asarray(d)
        fd_dir = (f(Z + h * d, T0) - f(Z - h * d, T0)) / (2 * h)
        np.testing.assert_allclose(fd_dir, float(jnp.sum(gz * d)), rtol=1e-7, atol=1e-8)
    fd_T = (f(Z, T0 + h) - f(Z, T0 - h)) / (2 * h)
    np.testing.assert_allclose(fd_T, float(gT), rtol=1e-7, atol=1e-8)


@pytest.mark.parametrize("name", FAMILIES)
def test_nonnegative_and_zero_at_the_maximizer(name):
    # Fenchel-Young inequality: L >= 0 for every target, because stationary returns the
    # global maximizer of <z, rho> + T S(rho), concave S or not (Renyi(2) and
    # Sharma-Mittal(2, 1.5) are not concave on N >= 3 keys, and are tested all the same).
    # L = 0 at y = rho*(z) up to round-off of the O(1) terms that cancel: 1e-12.
    # (Same shapes as above: the compiled probe is reused.)
    entropy = FAMILIES[name]
    T = jnp.asarray(T0)
    for s in (0.3, 3.0, 10.0):
        z = jnp.asarray(RNG.normal(size=(B, N)) * s)
        targets = [jax.nn.softmax(jnp.asarray(RNG.normal(size=(B, N)) * s), -1)]
        if name != "burg":  # one-hot targets (Burg's loss is +inf there: tested below)
            targets.append(jax.nn.one_hot(RNG.integers(0, N, size=B), N, dtype=z.dtype))
        for y in targets:
            assert np.all(np.asarray(_probe(entropy, z, y, T)[0]) >= -1e-12)
        rho = _probe(entropy, z, Y, T)[3]
        np.testing.assert_allclose(_probe(entropy, z, rho, T)[0], 0.0, rtol=0, atol=1e-12)


def test_burg_is_infinite_on_the_boundary():
    # Burg's Omega = -T sum ln y is +inf where a kept target weight is 0.
    y = jax.nn.one_hot(LABELS, N, dtype=Z.dtype)
    assert np.all(np.isinf(np.asarray(_probe(FAMILIES["burg"], Z, y, jnp.asarray(T0))[0])))


def test_second_derivative_is_the_stationary_jacobian():
    # The tangent of the custom JVP differentiates through `stationary`, so the Hessian in z
    # is its exact Jacobian (docs/math.md §3); tolerance 1e-12.
    entropy = fd.Tsallis(1.5)

    @ft.partial(jax.jit, **RUN_ONCE)
    def both(z, y):
        H = jax.hessian(lambda z: fenchel_young_loss(entropy, z, y, T0))(z)
        return H, fd.stationary_jacobian(entropy, z, T0)

    H, J = both(Z[2], Y[2])
    np.testing.assert_allclose(H, J, rtol=0, atol=1e-12)


def test_parameter_gradient():
    # d/dq at fixed (z, y) is T (dS/dq (rho*) - dS/dq (y)) (Danskin again); against central
    # differences in q (h = 1e-5, float64; tolerance 1e-7 as above).
    f = lambda q: fenchel_young_loss(fd.Tsallis(q), Z, Y, T0).sum()
    f = jax.jit(jax.value_and_grad(f), **RUN_ONCE)
    q, h = jnp.asarray(1.7), 1e-5
    fd_q = (f(q + h)[0] - f(q - h)[0]) / (2 * h)
    np.testing.assert_allclose(f(q)[1], fd_q, rtol=1e-7)


def test_shannon_is_softmax_cross_entropy():
    # optax's softmax cross-entropy (log-softmax in float64): one-hot targets equal it,
    # soft targets equal it minus H(y). Tolerance 1e-13: a logsumexp at round-off.
    optax = pytest.importorskip("optax")
    onehot = jax.nn.one_hot(LABELS, N, dtype=Z.dtype)
    np.testing.assert_allclose(
        fenchel_young_loss(fd.Shannon(), Z, onehot), optax.softmax_cross_entropy(Z, onehot),
        rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(
        fenchel_young_loss(fd.Shannon(), Z, LABELS), optax.softmax_cross_entropy(Z, onehot),
        rtol=1e-13, atol=1e-13)
    H = -jnp.sum(Y * jnp.log(Y), -1)
    np.testing.assert_allclose(
        fenchel_young_loss(fd.Shannon(), Z, Y), optax.softmax_cross_entropy(Z, Y) - H,
        rtol=1e-13, atol=1e-13)
    # a temperature: T * CE(z / T, y) - T H(y)
    np.testing.assert_allclose(
        fenchel_young_loss(fd.Shannon(), Z, Y, 2.5),
        2.5 * (optax.softmax_cross_entropy(Z / 2.5, Y) - H), rtol=1e-13, atol=1e-13)


def test_entmax_names_against_the_entmax_package():
    # entmax.sparsemax / entmax15 (and their losses) are sort-based closed forms: tolerance
    # 1e-12 (our solver stops at round-off); so is entmax_bisect with 200 halvings in
    # float64 (its bracket shrinks below an ulp of the threshold; measured 2e-14). The
    # package takes integer class targets; ours takes them too, and one-hot rows.
    torch = pytest.importorskip("torch")
    em = pytest.importorskip("entmax")
    z = np.asarray(RNG.normal(size=(6, 11)) * np.array([0.1, 1.0, 3.0, 10.0, 0.5, 2.0])[:, None])
    labels = RNG.integers(0, 11, size=6)
    zt, lt = torch.tensor(z, dtype=torch.float64), torch.tensor(labels)
    onehot = jax.nn.one_hot(jnp.asarray(labels), 11, dtype=jnp.float64)

    @ft.partial(jax.jit, **RUN_ONCE)
    def ours(z, alpha):  # a traced alpha: one compile for every alpha
        return (sparsemax(z), entmax15(z), entmax(z, alpha), sparsemax_loss(z, onehot),
                sparsemax_loss(z, jnp.asarray(labels)), entmax15_loss(z, onehot),
                entmax_loss(z, onehot, alpha))

    for alpha in (1.25, 1.5, 3.0):
        got = ours(jnp.asarray(z), jnp.asarray(alpha))
        refs = (em.sparsemax(zt, dim=-1), em.entmax15(zt, dim=-1),
                em.entmax_bisect(zt, alpha=alpha, dim=-1, n_iter=200), em.sparsemax_loss(zt, lt),
                em.sparsemax_loss(zt, lt), em.entmax15_loss(zt, lt),
                em.entmax_bisect_loss(zt, lt, alpha, 200))
        for a, b in zip(got, refs):
            np.testing.assert_allclose(a, b.numpy(), rtol=0, atol=1e-12)


def test_alpha_one_is_softmax():
    # entmax issues #23/#24: alpha = 1 must be softmax, concrete or traced (tolerance:
    # round-off of one softmax, 1e-15), with finite gradients in z and alpha.
    np.testing.assert_allclose(entmax(Z, 1.0), jax.nn.softmax(Z), rtol=0, atol=1e-15)
    np.testing.assert_allclose(
        entmax_loss(Z, LABELS, 1.0), fenchel_young_loss(fd.Shannon(), Z, LABELS), atol=1e-15)

    @ft.partial(jax.jit, **RUN_ONCE)
    def traced(z, a):
        loss = lambda z, a: entmax_loss(z, LABELS, a).sum()
        return entmax(z, a), jax.grad(loss, argnums=(0, 1))(z, a)

    rho, (gz, ga) = traced(Z, jnp.asarray(1.0))
    np.testing.assert_allclose(rho, jax.nn.softmax(Z), rtol=0, atol=1e-15)
    assert np.all(np.isfinite(gz)) and np.isfinite(ga)
    rho, (gz, ga) = traced(Z, jnp.asarray(1.5))
    rho15 = _probe(FAMILIES["tsallis1.5"], Z, Y, jnp.asarray(1 / 1.5))[3]  # = entmax15(Z)
    np.testing.assert_allclose(rho, rho15, rtol=0, atol=1e-12)
    assert np.all(np.isfinite(gz)) and np.isfinite(ga)
    with pytest.raises(ValueError, match="alpha > 0"):
        entmax(Z, 0.0)


def test_jit_vmap_grad():
    # The same numbers under jit and under vmap (round-off, 1e-12): a batch-shaped T equals
    # the rows solved one at a time, and the probe's scalar T.
    e = fd.Tsallis(1.5)
    Ts = jnp.asarray([0.5, 1.0, 2.0, 4.0])

    @ft.partial(jax.jit, **RUN_ONCE)
    def batched(z, y, T):
        row = lambda z, y, T: fenchel_young_loss(e, z, y, T)
        rows = jax.vmap(row)(z, y, T)
        g = jax.vmap(jax.grad(row))(z, y, T)
        rho = jax.vmap(lambda z, T: fd.stationary(e, z, T))(z, T)
        return fenchel_young_loss(e, z, y, T), rows, g, rho

    L, rows, g, rho = batched(Z, Y, Ts)
    np.testing.assert_allclose(L, rows, rtol=1e-12)
    np.testing.assert_allclose(g, rho - Y, rtol=0, atol=1e-12)
    L1 = batched(Z, Y, jnp.full(B, T0))[0]
    np.testing.assert_allclose(L1, _probe(e, Z, Y, jnp.asarray(T0))[0], rtol=1e-12)


def test_masks_and_axis():
    # A masked key is excluded: the loss equals the loss on the kept keys alone (1e-13),
    # its gradient there is exactly 0; -inf scores mean the same; `axis` moves the keys.
    e = fd.Tsallis(1.5)
    keep = np.ones((B, N), bool)
    keep[:, -2:] = False
    y = jnp.where(keep, Y, 0.0)
    y = y / y.sum(-1, keepdims=True)

    @ft.partial(jax.jit, **RUN_ONCE)
    def all_ways(z, y):
        f = lambda z, m: fenchel_young_loss(e, z, y, T0, mask=m).sum()
        zinf = jnp.where(keep, z, -jnp.inf)
        return (fenchel_young_loss(e, z[:, :-2], y[:, :-2], T0).sum(),
                jax.value_and_grad(f)(z, keep), jax.value_and_grad(f)(zinf, None),
                fenchel_young_loss(e, z.T, y.T, T0, mask=keep.T, axis=0).sum())

    ref, masked, neg_inf, by_axis = all_ways(Z, y)
    for L, g in (masked, neg_inf):
        np.testing.assert_allclose(L, ref, rtol=1e-13)
        assert np.all(np.isfinite(g)) and np.all(np.asarray(g)[~keep] == 0)
    np.testing.assert_allclose(by_axis, masked[0], rtol=1e-13)


def test_invalid_targets_raise():
    # Checked at run time with eqx.error_if: also under jit.
    e = fd.Shannon()
    f = jax.jit(lambda z, y: fenchel_young_loss(e, z, y))
    bad = Y.at[0, 0].add(-1.0)
    for y, msg in ((bad, "target must be >= 0"), (Y * 1.01, "sum to 1"),
                   (Y.at[0, 0].set(jnp.nan), "target must be >= 0")):
        with pytest.raises(Exception, match=msg):
            fenchel_young_loss(e, Z, y)
        with pytest.raises(Exception, match=msg):
            f(Z, y)
    keep = np.ones((B, N), bool)
    keep[0, 0] = False
    with pytest.raises(Exception, match="0 on masked"):
        fenchel_young_loss(e, Z, Y, mask=keep)
    with pytest.raises(Exception, match="class labels"):
        fenchel_young_loss(e, Z, LABELS.at[0].set(N))
    with pytest.raises(ValueError, match="neither a distribution"):
        fenchel_young_loss(e, Z, Y[:, :3])
    with pytest.raises(TypeError, match="mask must be boolean"):
        fenchel_young_loss(e, Z, Y, mask=keep.astype(float))
    with pytest.raises(Exception, match="T must be finite"):
        fenchel_young_loss(e, Z, Y, T=0.0)
