"""Charts as objects and readable result codes of `simulate` / `relax`.

References: the same solve selected by the chart's name (`coords="sphere"` / `"simplex"`),
which must give identical numbers; the chart's own `observe`, against which its cheaper
`weights_and_multiplier` is checked to round-off; `fisherdyn.result_name`.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import fisherdyn as fd
from fisherdyn import (
    AbstractCoordinates,
    FisherSystem,
    SimplexCoordinates,
    SphereCoordinates,
)

Z = np.array([0.8, 0.1, -0.6])


@pytest.mark.parametrize(
    "chart, name", [(SphereCoordinates(), "sphere"), (SimplexCoordinates(), "simplex")]
)
def test_chart_instance_equals_its_name(chart, name):
    """`coords=` takes an instance or its name; both give the same trajectory bit for bit."""
    kw = dict(mass=1.0, damping=0.5, t1=2.0, saveat=5)
    by_instance = fd.simulate(fd.Tsallis(1.5), Z, 1.0, coords=chart, **kw)
    by_name = fd.simulate(fd.Tsallis(1.5), Z, 1.0, coords=name, **kw)
    assert by_instance.coords == by_name.coords == name
    np.testing.assert_array_equal(by_instance.rho, by_name.rho)
    np.testing.assert_array_equal(by_instance.energy, by_name.energy)


def test_unknown_chart_is_a_clear_error():
    with pytest.raises(ValueError, match="coords must be"):
        fd.simulate(fd.Shannon(), Z, coords="polar")


def test_a_chart_must_declare_every_method():
    """A chart missing `constraint_drift` (or any other method) cannot be instantiated."""

    class Incomplete(AbstractCoordinates):
        name = "incomplete"

        def from_simplex(self, rho, rho_dot):
            return rho

        def vector_field(self, t, y, system):
            return y

        def overdamped_field(self, t, y, system):
            return y

        def observe(self, y, system, overdamped):
            return y

        def weights_and_multiplier(self, y, system, overdamped):
            return y

        def boundary_event(self, overdamped):
            return None

    with pytest.raises(TypeError, match="constraint_drift"):
        Incomplete()


@pytest.mark.parametrize("chart", [SphereCoordinates(), SimplexCoordinates()])
@pytest.mark.parametrize("overdamped", [False, True])
def test_weights_and_multiplier_match_observe(chart, overdamped):
    """The cheaper `(rho, lambda)` of a state equals that of `observe` (same formulas)."""
    system = FisherSystem(
        fd.Renyi(2.0), jnp.asarray(Z), jnp.asarray(0.7), jnp.asarray(1.3), jnp.asarray(0.4)
    )
    rho = jnp.asarray([0.5, 0.3, 0.2])
    y = chart.from_simplex(rho, None if overdamped else jnp.asarray([0.1, -0.04, -0.06]))
    rho_obs, _, lam_obs, _ = chart.observe(y, system, overdamped)
    rho_wm, lam_wm = chart.weights_and_multiplier(y, system, overdamped)
    np.testing.assert_allclose(rho_wm, rho_obs, rtol=0, atol=1e-15)
    np.testing.assert_allclose(lam_wm, lam_obs, rtol=0, atol=1e-15)
    assert float(chart.constraint_drift(y, overdamped)) <= 1e-15


def test_results_print_as_words():
    """`result_name` turns the result codes into words (the successful code has no message)."""
    tr = fd.simulate(fd.Shannon(), Z, 1.0, t1=1.0, saveat=3)
    assert tr.result_name == "successful"
    z = np.array([1.0, 0.0, -1.0])
    hit = fd.simulate(fd.Tsallis(2.0), z, 1.0, damping=0.1, t1=30.0, saveat=3, coords="simplex")
    assert hit.result_name == "boundary_reached"
    sol = fd.relax(fd.Shannon(), np.stack([Z, -Z]), 1.0, mass=1.0, damping=1.0)
    assert list(sol.result_name) == ["successful", "successful"]
    short = fd.relax(fd.Shannon(), Z, 1.0, mass=1.0, damping=1.0, t1=0.1, throw=False)
    assert short.result_name == "steady_state_not_reached"
    # their repr too (the successful code printed as `fisherdyn._results.RESULTS<>`): the
    # name, then the message where there is one; a batch as its names
    assert repr(tr.result) == str(tr.result) == "fisherdyn.RESULTS<successful>"
    message = fd.RESULTS._index_to_message[int(np.asarray(hit.result._value))]
    assert repr(hit.result) == f"fisherdyn.RESULTS<boundary_reached: {message}>"
    assert message.startswith("A weight reached the boundary")
    assert repr(sol.result) == "fisherdyn.RESULTS<['successful' 'successful']>"
    assert fd.RESULTS[short.result].startswith("steady_state_not_reached: No steady state")
