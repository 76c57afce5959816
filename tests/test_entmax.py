"""Tsallis stationary map against the `entmax` package (optional: `pip install .[entmax]`).

docs/math.md §2: the Tsallis map at q is alpha-entmax with alpha = q applied to z/(qT).
"""

import jax.numpy as jnp
import numpy as np
import pytest
from helpers import jit_stationary

import fisherdyn as fd

torch = pytest.importorskip("torch")
entmax = pytest.importorskip("entmax")


@pytest.mark.parametrize("q", [1.25, 1.5, 2.0, 3.0])
def test_tsallis_equals_entmax_bisect(q):
    # Reference: entmax.entmax_bisect (float64, 200 bisection steps); tolerance 1e-6, the
    # bisection's own resolution (entmax tests its closed forms against it the same way).
    rng = np.random.default_rng(0)
    Z = rng.normal(size=(6, 11)) * np.array([0.1, 1.0, 3.0, 10.0, 0.5, 2.0])[:, None]
    for T in (0.3, 1.0, 4.0):
        ref = entmax.entmax_bisect(torch.tensor(Z / (q * T), dtype=torch.float64), alpha=q,
                                   dim=-1, n_iter=200).numpy()
        rho = np.asarray(jit_stationary(fd.Tsallis(jnp.asarray(q)), jnp.asarray(Z), jnp.asarray(T)))
        np.testing.assert_allclose(rho, ref, rtol=0, atol=1e-6)
        # same support (entries clearly inside or outside it)
        clear = (ref > 1e-6) | (ref == 0)
        np.testing.assert_array_equal((rho > 0)[clear], (ref > 0)[clear])
