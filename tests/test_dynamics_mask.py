"""`mask=` on `simulate` and `relax`: a problem padded with masked keys equals the unpadded
one to round-off, masked weights are exactly 0 at every saved time, problems of different
lengths padded into one batch equal each solved alone, and `-inf` scores are masked keys.

Reference: the same solve without padding (the padded solve shares its step sizes: the
step-size norm skips masked keys).
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

import fisherdyn as fd

jax.config.update("jax_enable_x64", True)

Z5 = np.array([1.3, 0.2, -0.7, 0.5, -1.6])
PAD = np.concatenate([Z5, [0.4, -2.0, 7.0]])  # the padding's scores must not matter
MASK = np.arange(8) < 5
TOL = 1e-12


@pytest.mark.parametrize("coords", ["sphere", "simplex"])
@pytest.mark.parametrize("mass", [0.0, 0.7])
def test_padded_simulate_equals_unpadded(coords, mass):
    kw = dict(mass=mass, damping=1.0, t1=3.0, saveat=11, coords=coords)
    ent = fd.Tsallis(1.5) if coords == "sphere" else fd.Shannon()
    a = fd.simulate(ent, Z5, 1.2, **kw)
    b = fd.simulate(ent, PAD, 1.2, mask=MASK, **kw)
    assert b.result_name == "successful"
    assert np.max(np.abs(a.rho - b.rho[:, :5])) < TOL
    assert np.max(np.abs(a.rho_dot - b.rho_dot[:, :5])) < TOL
    assert np.all(b.rho[:, 5:] == 0) and np.all(b.rho_dot[:, 5:] == 0)
    assert np.all(b.rho_final[5:] == 0)
    assert int(a.stats["num_steps"]) == int(b.stats["num_steps"])


def test_minus_inf_scores_are_masked():
    kw = dict(mass=0.7, damping=1.0, t1=3.0, saveat=11)
    a = fd.simulate(fd.Shannon(), PAD, 1.2, mask=MASK, **kw)
    b = fd.simulate(fd.Shannon(), np.where(MASK, PAD, -np.inf), 1.2, **kw)
    np.testing.assert_array_equal(a.rho, b.rho)


@pytest.mark.parametrize("mass", [0.0, 0.7])
def test_padded_relax_equals_unpadded(mass):
    ent = fd.Tsallis(2.0)
    a = fd.relax(ent, Z5, 0.5, mass=mass, damping=1.0)
    b = fd.relax(ent, PAD, 0.5, mass=mass, damping=1.0, mask=MASK)
    assert b.result_name == "successful"
    assert np.max(np.abs(a.rho - b.rho[:5])) < TOL
    assert abs(float(a.lam - b.lam)) < TOL
    assert np.all(b.rho[5:] == 0)


def test_batch_of_lengths_in_one_call():
    rng = np.random.default_rng(0)
    lengths = [2, 3, 5, 8]
    rows = [rng.normal(size=n) for n in lengths]
    Z = np.zeros((len(lengths), 8))
    M = np.zeros((len(lengths), 8), bool)
    for i, r in enumerate(rows):
        Z[i, : len(r)], M[i, : len(r)] = r, True
    kw = dict(mass=0.5, damping=0.8, t1=2.0, saveat=5)
    batch = fd.simulate(fd.Shannon(), Z, 0.9, mask=M, **kw)
    fixed = fd.relax(fd.Shannon(), Z, 0.9, mass=0.5, damping=0.8, mask=M)
    for i, r in enumerate(rows):
        alone = fd.simulate(fd.Shannon(), r, 0.9, **kw)
        n = len(r)
        assert np.max(np.abs(batch.rho[i, :, :n] - alone.rho)) < TOL
        assert np.all(batch.rho[i, :, n:] == 0)
        soft = np.exp(r / 0.9) / np.sum(np.exp(r / 0.9))
        assert np.max(np.abs(fixed.rho[i, :n] - soft)) < 1e-10
        assert np.all(fixed.rho[i, n:] == 0)


def test_all_masked_is_an_error():
    with pytest.raises(ValueError, match="every key of a problem is masked"):
        fd.simulate(fd.Shannon(), Z5, mask=np.zeros(5, bool))
    with pytest.raises(ValueError, match="every key of a problem is masked"):
        fd.relax(fd.Shannon(), np.full(5, -np.inf), mass=1.0, damping=1.0)
    with pytest.raises(ValueError, match="mask must be boolean"):
        fd.simulate(fd.Shannon(), Z5, mask=np.ones(5))


def test_masked_spectrum_has_no_masked_modes():
    a = fd.relaxation_spectrum(fd.Shannon(), Z5, 1.2, mass=0.7, damping=1.0)
    b = fd.relaxation_spectrum(fd.Shannon(), PAD, 1.2, mass=0.7, damping=1.0, mask=MASK)
    assert np.max(np.abs(a.omega2 - b.omega2[:4])) < 1e-12
    assert np.max(np.abs(a.rates - b.rates[:4])) < 1e-12
    assert np.all(np.isinf(b.omega2[4:])) and np.all(b.modes[:, 4:] == 0)
    assert np.all(b.modes[5:, :] == 0) and np.all(b.rho[5:] == 0)
    np.testing.assert_allclose(b.decay_rates[:4], a.decay_rates, atol=1e-12)
    assert abs(float(a.slowest_rate - b.slowest_rate)) < 1e-12
