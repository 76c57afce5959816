"""One chunk of a sweep: its problems as one batch through `fisherdyn.relax`, and the
per-problem summaries stored for it."""

from __future__ import annotations

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._dynamics import relax, relaxation_spectrum
from .._entropies import parse_entropy
from .._stationary import stationary
from ._spec import Chunk, SweepSpec

__all__ = ["compute_chunk", "VARIABLES"]

# name: (dtype, fill value of a problem not computed yet, description)
VARIABLES = {
    "t_converge": ("f8", np.nan, "time at which the steady-state event of fisherdyn.relax fired"),
    "result": ("i4", -1, "fisherdyn.RESULTS code of the relaxation (see flag_meanings)"),
    "max_abs_err": ("f8", np.nan, "max_i |rho_relax_i - rho_stationary_i|"),
    "residual": ("f8", np.nan, "stationarity residual of the polished fixed point"),
    "n_steps": ("i8", -1, "integration steps taken by fisherdyn.relax"),
    "slowest_rate": ("f8", np.nan, "min_k -Re s_k of fisherdyn.relaxation_spectrum at rho*"),
    "damping_ratio": (
        "f8",
        np.nan,
        "gamma / (2 sqrt(m omega_1^2)), omega_1^2 the softest stiffness (inf for m = 0)",
    ),
    "overshoot": (
        "f8",
        np.nan,
        "max(0, -min_t <rho(t)-rho*, rho0-rho*> / |rho0-rho*|^2) on the saved path",
    ),
}


@functools.cache
def _entropy(label: str):
    return parse_entropy(label)


def _inputs(spec: SweepSpec, chunk: Chunk, padded: int):
    """Scores, T, mass and damping of the chunk's problems in (T, damping, seed) order,
    padded to `padded` problems with copies of the last (one compiled shape per group)."""
    n = spec.n_keys[chunk.n_keys]
    Ts = spec.T[chunk.T]
    Ds = spec.damping[chunk.damping]
    Ss = spec.seeds[chunk.seed]
    draws = np.stack([spec.scores_for(n, s) for s in Ss])
    grid_T, grid_D, grid_S = np.meshgrid(
        np.array(Ts), np.array(Ds), np.arange(len(Ss)), indexing="ij"
    )
    z = draws[grid_S.ravel()]
    T = grid_T.ravel()
    D = grid_D.ravel()
    pad = padded - z.shape[0]
    if pad:
        z = np.concatenate([z, np.repeat(z[-1:], pad, 0)])
        T = np.concatenate([T, np.repeat(T[-1:], pad)])
        D = np.concatenate([D, np.repeat(D[-1:], pad)])
    M = np.full_like(T, spec.mass[chunk.mass])
    return z, T, M, D


@eqx.filter_jit
def _fixed_point_and_modes(entropy, z, T, mass, damping):
    # one temperature per row, explicitly: a T of shape (B,) is ambiguous when B == N
    rho = stationary(entropy, z, T[:, None])

    def one(z, rho, T, m, g):
        sp = relaxation_spectrum(entropy, z, T, mass=m, damping=g, rho=rho)
        return sp.slowest_rate, sp.omega2[0]

    rate, omega2 = jax.vmap(one)(z, rho, T, mass, damping)
    return rho, rate, omega2


def _shard(arrays):
    """Split the batch axis over the local devices (a `NamedSharding`), when there are
    several; `relax` then runs each shard on its own device."""
    devices = jax.local_devices()
    if len(devices) == 1:
        return arrays
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    mesh = Mesh(np.array(devices), ("batch",))
    return [
        jax.device_put(a, NamedSharding(mesh, P("batch", *([None] * (a.ndim - 1)))))
        for a in arrays
    ]


def _overshoot(path, rho_star, rho0):
    """The largest excursion past the fixed point along the initial displacement, as a
    fraction of it; NaN where the start is the fixed point."""
    ts = np.asarray(path.ts)
    rho = np.asarray(path.rho)
    e0 = rho0 - rho_star
    norm2 = np.sum(e0 * e0, -1)
    s = np.einsum("bkn,bn->bk", rho - rho_star[:, None, :], e0)
    s = np.where(np.isfinite(ts) & np.all(np.isfinite(rho), -1), s, np.inf)
    with np.errstate(invalid="ignore", divide="ignore"):
        frac = np.maximum(0.0, -np.min(s, -1) / norm2)
    return np.where(norm2 > 1e-24, frac, np.nan)


def compute_chunk(spec: SweepSpec, chunk: Chunk, padded: int) -> dict[str, np.ndarray]:
    """The stored variables of one chunk, each of shape (T, damping, seed) of the chunk.

    **Arguments:**
    - `spec`, `chunk`: the sweep and the block of it to compute.
    - `padded`: the batch size to run (>= `chunk.size`): every chunk of a group runs at the
      same size, so it compiles once.
    """
    entropy = _entropy(spec.families[chunk.family])
    z, T, M, D = _inputs(spec, chunk, padded)
    ndev = len(jax.local_devices())
    if ndev > 1 and padded % ndev:
        extra = ndev - padded % ndev
        z, T, M, D = (np.concatenate([a, np.repeat(a[-1:], extra, 0)]) for a in (z, T, M, D))
    dtype = jnp.result_type(float)
    z, T, M, D = _shard([jnp.asarray(a, dtype) for a in (z, T, M, D)])
    rho_st, rate, omega2 = _fixed_point_and_modes(entropy, z, T, M, D)
    saveat = None
    if spec.n_save:
        # on the device, from the device's rates: no round trip to the host between the
        # two programs of the chunk
        ok = jnp.isfinite(rate) & (rate > 0)
        horizon = jnp.where(ok, spec.horizon / jnp.where(ok, rate, 1.0), 100.0)
        saveat = horizon[:, None] * jnp.linspace(0.0, 1.0, spec.n_save, dtype=dtype)[None, :]
    # A Python 0 selects the overdamped flow (a first-order system); `relax` decides that
    # from a concrete mass, so an all-zero batch is passed as the number.
    mass = 0.0 if spec.mass[chunk.mass] == 0 else M
    sol = relax(
        entropy,
        z,
        T,
        mass=mass,
        damping=D,
        saveat=saveat,
        rtol=spec.rtol,
        atol=spec.atol,
        tol=spec.tol,
        max_steps=spec.max_steps,
        throw=False,
    )
    rho = np.asarray(sol.rho)
    rho_st = np.asarray(rho_st)
    m = spec.mass[chunk.mass]
    g = np.asarray(D)
    w = np.asarray(omega2)
    with np.errstate(invalid="ignore", divide="ignore"):
        zeta = np.full_like(g, np.inf) if m == 0 else g / (2 * np.sqrt(m * w))
    n = rho.shape[-1]
    out = {
        "t_converge": np.asarray(sol.t),
        "result": np.asarray(sol.result._value).astype(np.int32),
        "max_abs_err": np.max(np.abs(rho - rho_st), -1),
        "residual": np.asarray(sol.residual),
        "n_steps": np.asarray(sol.stats["num_steps"]).astype(np.int64),
        "slowest_rate": np.asarray(rate),
        "damping_ratio": zeta,
        "overshoot": (
            _overshoot(sol.path, rho, np.full_like(rho, 1.0 / n))
            if sol.path is not None
            else np.full(rho.shape[0], np.nan)
        ),
    }
    shape = tuple(s.stop - s.start for s in (chunk.T, chunk.damping, chunk.seed))
    k = chunk.size
    return {name: np.asarray(v)[:k].reshape(shape) for name, v in out.items()}
