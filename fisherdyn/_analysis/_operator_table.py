"""The operator table: every family's stationary map, measured (MATH.md section 2).

Each row is computed, not typed in: the support size of `stationary` at fixed scores, the
tail class fitted on a long synthetic score ramp, and the distance between `stationary` and
the independent root-solver realization `solve_stationary` (both of its methods).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import scipy.optimize

from .._entropies import Abe, Burg, Kaniadakis, Renyi, Shannon, SharmaMittal, Tsallis
from .._stationary import solve_stationary
from .._stationary import stationary

__all__ = ["operator_table", "format_operator_table", "DEFAULT_FAMILIES", "DEFAULT_SCORES"]

DEFAULT_FAMILIES = (
    ("Shannon", Shannon()),
    ("Tsallis q=1.5", Tsallis(1.5)),
    ("Renyi q=2", Renyi(2.0)),
    ("SharmaMittal q=2 r=1.5", SharmaMittal(2.0, 1.5)),
    ("Kaniadakis k=0.3", Kaniadakis(0.3)),
    ("Burg", Burg()),
    ("Abe q=1.5", Abe(1.5)),
)
DEFAULT_SCORES = (2.0, 1.2, 0.9, 0.3, -0.1, -0.8, -1.5, -2.6)


def _linfit(x, y):
    """Least-squares line y = a + b x; returns (b, rms residual)."""
    A = np.stack([np.ones_like(x), x], 1)
    coef, *_ = np.linalg.lstsq(A, y, rcond=None)
    return coef[1], float(np.sqrt(np.mean((A @ coef - y) ** 2)))


def measure_tail(entropy, *, T=1.0, length=None, n=401, dtype=jnp.float64) -> dict:
    """Classify the tail of `stationary(entropy, ramp, T)` on $z = \\mathrm{linspace}(0, -L, n)$.

    `length` defaults to min(200, 0.45 T |ln tiny(dtype)|), so that an exponential tail does
    not underflow to zero within the ramp (float32: about 39 T).

    - exact zeros -> `cutoff` (where: the last score with positive weight);
    - otherwise on the far half of the ramp ($z \\le -L/2$) two fits are compared:
      $\\ln\\rho$ vs $z$ (exponential, reports the rate $d\\ln\\rho/dz$, 1/T for Shannon) and
      $\\ln\\rho$ vs $\\ln(s - z)$ with the shift $s$ fitted by a 1-D search
      (algebraic, reports the exponent; -1 is Burg's inverse-linear law,
      $-1/\\kappa$ Kaniadakis', $-q/(q-1)$ Abe's). The fit with the smaller rms wins.
    """
    if length is None:
        length = min(200.0, 0.45 * T * -np.log(np.finfo(np.dtype(dtype)).tiny))
    z = jnp.linspace(0.0, -length, n, dtype=dtype)
    rho = np.asarray(stationary(entropy, z, T), np.float64)
    zn = np.asarray(z, np.float64)
    if np.any(rho == 0):
        last = int(np.max(np.nonzero(rho > 0)[0]))
        return dict(kind="cutoff", value=float(zn[last]), support=last + 1, n=n,
                    text=f"cutoff: rho=0 for z<={zn[last + 1]:.3g} ({last + 1}/{n} > 0)")
    far = zn <= -length / 2
    lr = np.log(rho[far])
    rate, rms_exp = _linfit(zn[far], lr)
    # algebraic: ln rho = a + b ln(s - z). The shift s (minus the multiplier, any sign) is
    # parametrized by d = s - max(z_far) > 0, found by a log-grid scan of the fit residual
    # refined by a bounded 1-D minimization.
    top = np.max(zn[far])

    def fit_at(log_d):
        return _linfit(np.log(np.exp(log_d) + top - zn[far]), lr)

    grid = np.log(np.geomspace(1e-6 * length, 1e4 * length, 241))
    k = int(np.argmin([fit_at(g)[1] for g in grid]))
    lo, hi = grid[max(k - 1, 0)], grid[min(k + 1, grid.size - 1)]
    log_d = scipy.optimize.minimize_scalar(
        lambda g: fit_at(g)[1], bounds=(lo, hi), method="bounded", options=dict(xatol=1e-10)
    ).x
    b, rms = fit_at(log_d)
    best = (b, rms, float(np.exp(log_d) + top))
    expo, rms_alg, _ = best
    if rms_exp <= rms_alg:
        return dict(kind="exponential", value=float(rate), rms=rms_exp,
                    text=f"exponential: dln(rho)/dz={rate:.4g}")
    kind = "inverse-linear" if abs(expo + 1) < 0.02 else "algebraic"
    return dict(kind=kind, value=float(expo), rms=rms_alg,
                text=f"{kind}: rho ~ |z|^{expo:.4g}")


def operator_table(dtype=jnp.float64, *, scores=DEFAULT_SCORES, T=1.0, families=None):
    """Measure one row per entropy family (default parameters, MATH.md §2).

    **Arguments:**
    - `dtype`: the dtype of the scores fed to `stationary`.
    - `scores`: the fixed scores of the support / agreement columns (8 by default).
    - `T`: temperature.
    - `families`: optional sequence of (label, entropy); default `DEFAULT_FAMILIES`.

    **Returns:** a list of dicts with keys `family`, `realization`, `support` (count of
    $\\rho_i > 0$ at the scores), `tail` (dict from `measure_tail`), `tail_reference`
    (the expected exponent/rate and its formula, where one is known), `err_optimistix`,
    `err_scipy` ($\\max|$stationary - solve_stationary$|$ per method), `residual` (the
    stationarity residual of the scipy solve).
    """
    families = DEFAULT_FAMILIES if families is None else families
    z = jnp.asarray(scores, dtype)
    z64 = jnp.asarray(scores, jnp.float64)
    rows = []
    for label, entropy in families:
        rho = stationary(entropy, z, T)
        rho64 = jnp.asarray(rho, jnp.float64)
        errs = {}
        residual = None
        for method in ("optimistix", "scipy"):
            sol = solve_stationary(entropy, z64, T, method=method)
            errs[method] = float(jnp.max(jnp.abs(rho64 - sol.rho)))
            residual = float(sol.residual)
        ref, ref_text = entropy.tail_reference(T)
        rows.append(
            dict(
                family=label,
                realization=type(entropy).realization,
                support=int(jnp.sum(rho > 0)),
                n=int(z.size),
                tail=measure_tail(entropy, T=T, dtype=dtype),
                tail_reference=(ref, ref_text),
                err_optimistix=errs["optimistix"],
                err_scipy=errs["scipy"],
                residual=residual,
            )
        )
    return rows


def format_operator_table(rows) -> str:
    """Render `operator_table()` rows as a fixed-width text table."""
    head = ("family", "realization", "support", "tail (measured on a ramp)", "expected",
            "|stat-optx|", "|stat-scipy|")
    body = []
    for r in rows:
        ref, ref_text = r["tail_reference"]
        expected = f"{ref_text}={ref:.4g}" if ref is not None else ""
        body.append((r["family"], r["realization"], f"{r['support']}/{r['n']}",
                     r["tail"]["text"], expected, f"{r['err_optimistix']:.1e}",
                     f"{r['err_scipy']:.1e}"))
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body)]

    def line(cells):
        return "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()

    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line(head), sep] + [line(b) for b in body])
