"""The summary figure of a sweep: relaxation time and damping ratio over T x damping, one
panel per family and mass."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

__all__ = ["summary_figure"]


def summary_figure(ds, path: Path) -> Path:
    """Write the figure: colour = median `t_converge` over seeds and N of the successful
    problems, text = median damping ratio (`inf` for the overdamped flow)."""
    from .._optional import require

    matplotlib = require("matplotlib", extra="sweep", what="the sweep's summary figure")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    families, masses = ds["family"].values, ds["mass"].values
    Ts, gammas = ds["T"].values, ds["damping"].values
    ok = ds["result"] == 0
    t = ds["t_converge"].where(ok).median(["n_keys", "seed"])
    zeta = ds["damping_ratio"].where(ok).median(["n_keys", "seed"])
    fig, axes = plt.subplots(
        len(families),
        len(masses),
        figsize=(3.2 * len(masses) + 1, 2.6 * len(families) + 0.6),
        squeeze=False,
        constrained_layout=True,
    )
    finite = np.isfinite(t.values) & (t.values > 0)
    vmin, vmax = (t.values[finite].min(), t.values[finite].max()) if finite.any() else (1, 10)
    norm = matplotlib.colors.LogNorm(vmin=vmin, vmax=max(vmax, vmin * 1.01))
    image = None
    for i, fam in enumerate(families):
        for j, m in enumerate(masses):
            ax = axes[i, j]
            cell = t.sel(family=fam, mass=m).transpose("T", "damping").values
            image = ax.imshow(cell, origin="lower", aspect="auto", norm=norm, cmap="viridis")
            z = zeta.sel(family=fam, mass=m).transpose("T", "damping").values
            for a in range(len(Ts)):
                for b in range(len(gammas)):
                    label = "inf" if np.isinf(z[a, b]) else f"{z[a, b]:.2g}"
                    ax.text(b, a, f"ζ={label}", ha="center", va="center", fontsize=7, color="w")
            ax.set_xticks(range(len(gammas)), [f"{g:g}" for g in gammas])
            ax.set_yticks(range(len(Ts)), [f"{x:g}" for x in Ts])
            ax.set_title(f"{fam}, m = {m:g}", fontsize=9)
            ax.set_xlabel("damping γ")
            ax.set_ylabel("T")
    fig.colorbar(image, ax=axes, label="median relaxation time t_converge")
    fig.suptitle("relaxation time (colour), damping ratio ζ (text)", fontsize=9)
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)
    return path
