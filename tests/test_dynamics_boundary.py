"""A finite-time boundary hit in the sphere chart where the family's force diverges at
finite free energy: `simulate` stops there with `RESULTS.boundary_singular` instead of
stalling until `max_steps` (the inertial dynamics is not well-posed at that point)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fisherdyn as fd
from fisherdyn._dynamics._coordinates import boundary_force_diverges
from fisherdyn._dynamics._system import FisherSystem

jax.config.update("jax_enable_x64", True)

# N = 3 reproducer: without the event the solve spends 5000 steps to reach t = 1.7
Z = np.array([4.6, -4.6, -7.4])
KW = dict(T=7.8, mass=0.3, damping=0.13, t1=5.0, saveat=5, max_steps=5000)


@pytest.mark.parametrize(
    "entropy, singular",
    [
        (fd.Shannon(), False),
        (fd.Abe(0.2), True),
        (fd.Abe(0.8), False),
        (fd.Kaniadakis(0.6), True),
        (fd.Kaniadakis(0.5), False),
        (fd.Kaniadakis(0.3), False),
        (fd.Tsallis(0.4), True),
        (fd.Tsallis(1.5), False),
    ],
)
def test_singular_boundary_force_is_detected(entropy, singular):
    system = FisherSystem(entropy, jnp.zeros(3), 1.0, 1.0, 1.0)
    assert bool(boundary_force_diverges(system)) is singular


def test_boundary_hit_stops_with_its_own_code():
    out = fd.simulate(fd.Abe(0.2), Z, throw=False, **KW)
    assert out.result_name == "boundary_singular"
    assert float(out.t_final) < 1.0
    assert int(out.stats["num_steps"]) < 500
    assert float(np.min(out.rho_final)) < 1e-8
    with pytest.raises(Exception, match="not well-posed"):
        fd.simulate(fd.Abe(0.2), Z, **KW)


def test_remedies_named_in_the_message_work():
    over = fd.simulate(fd.Abe(0.2), Z, **{**KW, "mass": 0.0})
    assert over.result_name == "successful"
    simplex = fd.simulate(fd.Abe(0.2), Z, coords="simplex", throw=False, **KW)
    assert simplex.result_name in ("boundary_reached", "successful")
    regular = fd.simulate(fd.Kaniadakis(0.3), Z, **KW)
    assert regular.result_name == "successful"
