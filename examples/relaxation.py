"""The damped dynamics: a trajectory, a relaxation to the fixed point, and the linear
relaxation spectrum (the README's "Dynamics").

Run: python examples/relaxation.py
"""

import jax
import jax.numpy as jnp
import fisherdyn as fd

jax.config.update("jax_enable_x64", True)

z = jnp.array([1.3, 0.2, -0.7, 0.9, -2.0])
traj = fd.simulate(fd.Kaniadakis(0.3), z, T=0.8, mass=1.0, damping=0.5, t1=50.0)
print(traj.rho[-1], traj.energy[0], traj.energy[-1])   # H decreases: dH/dt = -γ Σρ̇²/ρ

sol = fd.relax(fd.Tsallis(1.5), z, 0.8, mass=1.0, damping=2.0)  # steady state + Newton polish
print(sol.rho, abs(sol.rho - fd.stationary(fd.Tsallis(1.5), z, 0.8)).max())

spec = fd.relaxation_spectrum(fd.Shannon(), z, 0.8, mass=1.0, damping=0.5)
print(spec.omega2)                                      # Shannon: every ω² equals T
