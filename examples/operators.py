"""Stationary operators: weights of several families, a Jacobian, an independent
cross-check, and the self-consistent branches of Renyi (the README's "Operators").

Run: python examples/operators.py
"""

import jax
import jax.numpy as jnp
import fisherdyn as fd

jax.config.update("jax_enable_x64", True)          # float64 for verification

z = jnp.array([1.3, 0.2, -0.7, 0.9, -2.0])
rho = fd.stationary(fd.Kaniadakis(0.3), z, T=0.8)  # dense, algebraic tail
sparse = fd.stationary(fd.Tsallis(1.5), z, T=0.8)  # entmax-1.5 of z/(1.5 T): exact zeros
J = fd.stationary_jacobian(fd.Abe(1.5), z, 0.8)    # closed form, equals jax.jacobian
check = fd.solve_stationary(fd.Abe(1.5), z, 0.8, method="scipy")   # independent solver
print(rho, sparse, abs(check.rho - fd.stationary(fd.Abe(1.5), z, 0.8)).max())

# Renyi / Sharma-Mittal can have several self-consistent solutions; `stationary`
# returns the one of least free energy, `stationary_branches` all of them (padded:
# keep the slots marked valid).
z8 = jnp.zeros(8).at[0].set(1.0)
branches = fd.stationary_branches(fd.Renyi(2.0), z8, 0.4)   # three branches here
for k in jnp.flatnonzero(branches.valid):
    print(float(branches.M[k]), float(branches.free_energy[k]), bool(branches.stable[k]))
