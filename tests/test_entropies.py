"""The entropy families themselves (docs/math.md §2): values, gradients, laws, validation.

References: the defining formulas of docs/math.md §2 in mpmath (`helpers.RefFamily`), their
mpmath derivatives, autodiff of `value`, round trips of the law and its inverse, and the
symmetries of the definitions.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import mpmath as mp
import numpy as np
import pytest
from helpers import DPS, SPECS, RefFamily, make, record, spec_id, tsallis_shaped

import fisherdyn as fd


# --------------------------------------------------------------------------- entropy methods


def _interior_points(n=7, k=3):
    rng = np.random.default_rng(7)
    pts = [rng.dirichlet(np.ones(n)) for _ in range(k)]
    pts.append(np.r_[0.97, np.full(n - 1, 0.03 / (n - 1))])  # a peaked point with small entries
    return pts


def _tangent(h):
    """Projection on the simplex tangent space (constants drop out of the stationary law)."""
    return h - h.mean(-1, keepdims=True)


@pytest.mark.parametrize("spec", SPECS, ids=spec_id)
def test_entropy_value_and_grad(spec):
    # References: the defining formula of docs/math.md §2 in mpmath (tolerance 1e-14 (1 + |S|));
    # h = dS/drho of that formula in mpmath (tolerance 1e-13 (1 + max|h|)); the tangent part of
    # jax.grad(value) (tolerance 1e-12 (1 + max|h|)).
    entropy = make(spec)
    fam = RefFamily(spec)
    grad_ad = jax.grad(entropy.value)
    for rho in _interior_points():
        r = jnp.asarray(rho)
        S = float(entropy.value(r))
        with mp.workdps(DPS):
            S_ref = float(fam.S(rho))
            h_ref = np.array([-float(fam.minus_grad(rho, i)) for i in range(len(rho))])
        record("|S - mpmath S| / (1 + |S|)", abs(S - S_ref) / (1 + abs(S_ref)))
        assert abs(S - S_ref) <= 1e-14 * (1 + abs(S_ref))
        h = np.asarray(entropy.grad(r))
        scale = 1 + np.max(np.abs(h_ref))
        record("|grad - mpmath dS/drho| / scale", np.max(np.abs(h - h_ref)) / scale)
        np.testing.assert_allclose(h, h_ref, rtol=0, atol=1e-13 * scale)
        np.testing.assert_allclose(_tangent(h), _tangent(np.asarray(grad_ad(r))), rtol=0,
                                   atol=1e-12 * scale)
        # mask: the kept entries form a distribution, the masked ones hold garbage; value =
        # formula on the kept sub-vector, zero gradient on masked entries
        mask = np.array([True, False, True, True, False, True, True])
        sub = rho[mask] / rho[mask].sum()
        rm = np.where(mask, 0.0, 0.5)
        rm[mask] = sub
        with mp.workdps(DPS):
            S_sub = float(fam.S(sub))
        S_m = float(entropy.value(jnp.asarray(rm), jnp.asarray(mask)))
        assert abs(S_m - S_sub) <= 1e-14 * (1 + abs(S_sub))
        assert np.all(np.asarray(entropy.grad(jnp.asarray(rm), jnp.asarray(mask)))[~mask] == 0)




@pytest.mark.parametrize(
    "spec", [s
             for s in SPECS], ids=spec_id)
def test_grad_is_autodiff_of_value(spec):
    # Reference: jax.grad(value) at interior points, in full (tolerance 1e-12 (1 + max|h|)).
    entropy = make(spec)
    for rho in _interior_points():
        r = jnp.asarray(rho)
        h, h_ad = np.asarray(entropy.grad(r)), np.asarray(jax.grad(entropy.value)(r))
        scale = 1 + np.max(np.abs(h))
        record("|grad - jax.grad(value)| / scale", np.max(np.abs(h - h_ad)) / scale)
        np.testing.assert_allclose(h, h_ad, rtol=0, atol=1e-12 * scale)


@pytest.mark.parametrize("spec", [s for s in SPECS if not tsallis_shaped(s)], ids=spec_id)
def test_separable_law_methods(spec):
    # References: G, G' of docs/math.md §2 in mpmath (tolerance 1e-13 relative; G' by mpmath
    # differentiation) and the round trip G_inverse(G(x)) = x on x in [1e-4, 1] (tolerance: its
    # condition number, G_inverse works in the gauge G - G(1)).
    entropy = make(spec)
    fam = RefFamily(spec)
    x = np.geomspace(1e-4, 1.0, 9)
    G = np.asarray(entropy.G(jnp.asarray(x)))
    Gp = np.asarray(entropy.G_prime(jnp.asarray(x)))
    with mp.workdps(DPS):
        G_ref = np.array([float(fam.G(mp.mpf(v))) for v in x])
        Gp_ref = np.array([float(mp.diff(fam.G, mp.mpf(v))) for v in x])
    np.testing.assert_allclose(G, G_ref, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(Gp, Gp_ref, rtol=1e-13)
    back = np.asarray(entropy.G_inverse(jnp.asarray(G_ref)))
    # condition number of x = G^-1(y) under an absolute rounding eps max(|G(1)|, |y|) of the
    # shifted argument: rtol = 1e-13 + 8 eps max(|G(1)|, |G(x)|) / (x G'(x))
    with mp.workdps(DPS):
        G1 = abs(float(fam.G(mp.mpf(1))))
    rtol = 1e-13 + 8 * np.finfo(float).eps * np.maximum(G1, np.abs(G_ref)) / (x * Gp_ref)
    record("|G_inverse(G(x)) / x - 1| / rtol", np.max(np.abs(back / x - 1) / rtol))
    assert np.all(np.abs(back / x - 1) <= rtol)


def test_parameters_are_the_constructor_arguments():
    """`parameters` lists what the family was built from and nothing `for_tracing` records:
    labels, saved options and fits read it (a static field once leaked into every label)."""
    from fisherdyn._entropies._parse import default_entropies, entropy_label

    for e in default_entropies(examples=True):
        params = e.parameters
        assert type(e)(*params.values()) == e
        assert e.for_tracing().parameters == params
        assert entropy_label(e.for_tracing()) == entropy_label(e)
    assert fd.Kaniadakis(0.3).for_tracing().parameters == {"kappa": 0.3}
    assert fd.SharmaMittal(2.0, 1.5).parameters == {"q": 2.0, "r": 1.5}


def test_kaniadakis_law_both_forms():
    # Reference: G = ((1+k) x^k - (1-k) x^-k)/(2k) and G' = ((1+k) x^k + (1-k) x^-k)/(2x) in
    # mpmath, from the deep tail to x = 1 and around G's zero. A concrete |kappa| >= 0.2 takes
    # the one-exp form (absolute error about eps/k), a traced or smaller kappa the expm1 form;
    # tolerance eps (16 + 2 |k ln x|) max(1, |G|) for G (a factor 3 above eps/k at k = 0.2,
    # plus the condition number |k ln x| of x^k in the deep tail), the same relative tolerance
    # for G' (a sum of two positive terms).
    eps = np.finfo(float).eps
    x = np.r_[np.geomspace(1e-300, 1.0, 61), np.exp(-np.linspace(0.5, 1.5, 11)),
              1 - np.geomspace(1e-12, 1e-2, 5)]
    for kappa in (0.2, 0.3, 0.7, 0.95, 0.05):
        ref = RefFamily(("kaniadakis", kappa))
        with mp.workdps(DPS):
            G_ref = np.array([float(ref.G(mp.mpf(v))) for v in x])
            k = mp.mpf(kappa)
            Gp_ref = np.array([float(((1 + k) * mp.mpf(v) ** k + (1 - k) * mp.mpf(v) ** -k)
                                     / (2 * mp.mpf(v))) for v in x])
        e = fd.Kaniadakis(kappa)
        traced = jax.jit(lambda kap, v: fd.Kaniadakis(kap).G(v))(jnp.asarray(kappa),
                                                                   jnp.asarray(x))
        # as relax traces it: the form chosen from the concrete kappa, kappa then an array
        prepared = jax.tree_util.tree_map(jnp.asarray, e.for_tracing())
        assert prepared.one_exp == (kappa >= 0.2)
        as_relax = jax.jit(lambda ent, v: ent.G(v))(prepared, jnp.asarray(x))
        for G in (np.asarray(e.G(jnp.asarray(x))), np.asarray(traced), np.asarray(as_relax)):
            err = np.abs(G - G_ref) / np.maximum(1.0, np.abs(G_ref))
            record("Kaniadakis |G - G_ref| / (eps max(1, |G|))", np.max(err) / eps)
            tol = eps * (16 + 2 * kappa * np.abs(np.log(x)))
            assert np.all(err <= tol), (kappa, np.max(err / tol))
        Gp = np.asarray(e.G_prime(jnp.asarray(x)))
        fin = np.isfinite(Gp_ref)  # G' overflows below x ~ 1e-300 / (1 - k)
        assert np.all(Gp[~fin] == np.inf)
        rel = np.abs(Gp[fin] / Gp_ref[fin] - 1)
        assert np.all(rel <= eps * (16 + 2 * kappa * np.abs(np.log(x[fin])))), kappa


def test_abe_G_inverse_deep_tail():
    # Reference: the round trip G_inverse(G(x)) = x (tolerance 1e-12 relative) deep in the tail.
    for q in (3.0, 0.5, 1.5):
        x = np.array([1e-6, 1e-9])
        G = fd.Abe(q).G(jnp.asarray(x))
        np.testing.assert_allclose(np.asarray(fd.Abe(q).G_inverse(G)), x, rtol=1e-12)


def test_abe_value_reciprocal_symmetry():
    # Reference: S_A(q) = S_A(1/q) (docs/math.md §2); tolerance 1e-15 (1 + |S|).
    for rho in _interior_points():
        r = jnp.asarray(rho)
        for q in (0.5, 1.5, 3.0, 1 + 1e-8):
            a, b = float(fd.Abe(q).value(r)), float(fd.Abe(1 / q).value(r))
            assert abs(a - b) <= 1e-15 * (1 + abs(a))
        # q = 1 is Shannon exactly (no cancellation): tolerance 1e-15
        assert abs(float(fd.Abe(1.0).value(r)) - float(fd.Shannon().value(r))) <= 1e-15
        k_plus, k_minus = fd.Kaniadakis(0.3).value(r), fd.Kaniadakis(-0.3).value(r)
        assert abs(float(k_plus) - float(k_minus)) <= 1e-15


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "bad",
    [
        lambda: fd.Tsallis(1.0),
        lambda: fd.Tsallis(-1.0),
        lambda: fd.Tsallis(0.0),
        lambda: fd.Kaniadakis(0.0),
        lambda: fd.Kaniadakis(1.0),
        lambda: fd.Kaniadakis(-1.0),
        lambda: fd.Abe(0.0),
        lambda: fd.Abe(-2.0),
        lambda: fd.Renyi(1.0),
        lambda: fd.Renyi(-0.5),
        lambda: fd.SharmaMittal(2.0, 1.0),
        lambda: fd.SharmaMittal(1.0, 2.0),
        lambda: fd.Tsallis(float("nan")),
    ],
    ids=["tsallis1", "tsallis-1", "tsallis0", "kaniadakis0", "kaniadakis1", "kaniadakis-1",
         "abe0", "abe-2", "renyi1", "renyi-0.5", "sm_r1", "sm_q1", "tsallis_nan"],
)
def test_bad_parameters_raise(bad):
    with pytest.raises(ValueError):
        bad()


PARAMETRIZED = [(fd.Tsallis, "q", 1.5), (fd.Renyi, "q", 2.0), (fd.Kaniadakis, "kappa", 0.3),
                (fd.Abe, "q", 1.5), (fd.SharmaMittal, "q", 2.0), (fd.SharmaMittal, "r", 1.5)]


@pytest.mark.parametrize("cls, name, good", PARAMETRIZED,
                         ids=[f"{c.__name__}-{n}" for c, n, _ in PARAMETRIZED])
def test_parameter_types_checked_at_construction(cls, name, good):
    """A parameter that is not a real number or a real array (Kaniadakis("0.3") was accepted
    and failed in the first solve as a JAX TypeError) raises a one-line TypeError naming it;
    real numbers, NumPy / JAX real arrays and tracers are accepted."""
    others = {"q": 2.0, "r": 1.5} if cls is fd.SharmaMittal else {}

    def build(value):
        return cls(**{**others, name: value})

    for bad in (str(good), complex(good, 1.0), True, None, [good], np.array([good], complex),
                jnp.array(True)):
        message = f"{cls.__name__}'s parameter {name} must be a real"
        with pytest.raises(TypeError, match=message) as e:
            build(bad)
        assert len(str(e.value).splitlines()) == 1
    for ok in (good, np.float32(good), jnp.asarray(good), np.array([good, good])):
        assert np.all(np.asarray(getattr(build(ok), name)) == np.asarray(ok))
    if name != "kappa":  # an integer (no integer kappa is valid)
        assert getattr(build(3), name) == 3
    traced = jax.jit(lambda v: getattr(build(v), name) * 1.0)(good)
    assert float(traced) == pytest.approx(good)


def test_array_parameters_are_validated_entrywise():
    # an array of parameters was not validated at all (only scalars were read)
    with pytest.raises(ValueError, match="Tsallis needs q > 0 and q != 1"):
        fd.Tsallis(np.array([1.5, 1.0]))
    with pytest.raises(ValueError, match="Kaniadakis needs 0 < |kappa| < 1"):
        fd.Kaniadakis(jnp.array([0.3, 1.2]))
    assert fd.Abe(np.array([0.5, 2.0])).q.shape == (2,)


def test_unknown_entropy_lists_the_documented_names():
    """The names listed are those the docs and `--help` spell (`sharma_mittal`, not the
    lookup key `sharmamittal`), and each of them parses."""
    with pytest.raises(ValueError, match="unknown entropy") as e:
        fd.parse_entropy("foo")
    listed = str(e.value).split("choose one of: ")[1].split(", ")
    assert "sharma_mittal" in listed and "sharmamittal" not in listed
    library = {"shannon", "tsallis", "entmax", "renyi", "sharma_mittal", "kaniadakis", "burg",
               "abe"}
    assert library <= set(listed)
    for name in listed:
        # beyond the library's, only families registered from outside it (a test module's
        # custom family, when it ran first in this process)
        cls = type(fd.parse_entropy(name))
        assert name in library or not cls.__module__.startswith("fisherdyn.")
    assert fd.parse_entropy("sharmamittal:2,1.5") == fd.parse_entropy("sharma_mittal:2,1.5")


@pytest.mark.parametrize(
    "entropy, a",
    [(fd.Kaniadakis(k), k) for k in (1e-6, 0.01, 0.3, 0.95)]
    + [(fd.Tsallis(q), abs(q - 1)) for q in (0.5, 1.5, 3.0)],
    ids=lambda v: getattr(v, "name", None) and repr(v),
)
def test_power_laws_deep_in_the_tail(entropy, a):
    # Reference: G of docs/math.md §2 in mpmath at the float64 parameter, x from 1e-300 to
    # 1.5. Tolerance 8 eps (1 + a |ln x|) relative, a = kappa or |q - 1|: the exponent a ln x
    # carries the logarithm's rounding, magnified by a |ln x| (up to 655 at kappa = 0.95),
    # into x^a. Compared where G is a normal float, and for Kaniadakis away from its root
    # (|G| > 1e-3), where the relative error of any formula is unbounded.
    x = np.concatenate([np.geomspace(1e-300, 1.0, 61), [1.2, 1.5]])
    got = np.asarray(entropy.G(jnp.asarray(x)))
    with mp.workdps(40):
        if isinstance(entropy, fd.Kaniadakis):
            k = mp.mpf(float(entropy.kappa))
            ref = [((1 + k) * mp.mpf(v) ** k - (1 - k) * mp.mpf(v) ** (-k)) / (2 * k) for v in x]
        else:
            q = mp.mpf(float(entropy.q))
            ref = [q * mp.mpf(v) ** (q - 1) / (q - 1) for v in x]
        ref = np.array([float(r) for r in ref])
    floor = 1e-3 if isinstance(entropy, fd.Kaniadakis) else np.finfo(float).tiny
    keep = (np.abs(ref) > floor) & (np.abs(ref) < 1e300)
    tol = 8 * np.finfo(float).eps * (1 + a * np.abs(np.log(x)))
    rel = np.abs(got[keep] / ref[keep] - 1)
    record("|G / mpmath G - 1| / tol (deep tail)", np.max(rel / tol[keep]))
    assert np.all(rel <= tol[keep]), (float(np.max(rel / tol[keep])), x[keep][np.argmax(rel)])
