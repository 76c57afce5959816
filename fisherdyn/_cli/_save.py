"""`fisherdyn simulate --save PATH`: the whole trajectory as a NetCDF file (`.nc`, read by
`xarray.open_dataset`) or a NumPy archive (`.npz`, read by `numpy.load`).

The NetCDF file is NetCDF-3 written by xarray's scipy engine, which needs no library beyond
SciPy and which every NetCDF reader opens. Nothing here imports JAX.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

__all__ = ["save_arg", "add_save_option", "save_trajectory"]

SUFFIXES = (".nc", ".npz")

# the per-time arrays of the report, stored along (time,) or (time, key)
_PER_TIME = {
    "rho": "weights rho_i(t)",
    "rho_dot": "velocities d rho_i / dt",
    "lam": "the multiplier lambda(t) of the constraint sum rho = 1",
    "energy": "H = (m/2) sum rho_dot^2 / rho + F(rho)",
}


def save_arg(text: str) -> Path:
    """A `.nc` or `.npz` path that can be written: checked before any computation."""
    path = Path(text)
    if path.suffix.lower() not in SUFFIXES:
        raise argparse.ArgumentTypeError(f"must end in .nc or .npz, got {text!r}")
    from ._options import output_path_error

    error = output_path_error(path)
    if error is not None:
        raise argparse.ArgumentTypeError(error)
    return path


def add_save_option(p: argparse.ArgumentParser):
    p.add_argument(
        "--save",
        type=save_arg,
        default=None,
        metavar="PATH",
        help="write the whole trajectory (times, rho, velocities, multiplier, energy, the "
        "stationary weights, the result, the options) to a .nc file (xarray.open_dataset) "
        "or a .npz file (numpy.load); written whatever the result",
    )


def _options(args, z) -> dict:
    """The options of the run, as JSON-able scalars."""
    import importlib.metadata

    from ._verify import entropy_label

    try:
        version = importlib.metadata.version("fisherdyn")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    return dict(
        entropy=entropy_label(args.entropy),
        T=float(args.T),
        mass=float(args.mass),
        damping=float(args.damping),
        t1=float(args.t1),
        n_save=int(args.n_save),
        coords=args.coords,
        solver=args.solver,
        rtol=float(args.rtol),
        atol=float(args.atol),
        max_steps=int(args.max_steps),
        rho0="uniform" if args.rho0 is None else ",".join(map(repr, args.rho0)),
        n_keys=int(z.shape[-1]),
        fisherdyn_version=version,
    )


def _arrays(report, z) -> dict:
    import numpy as np

    out = {k: np.asarray(report[k], np.float64) for k in _PER_TIME}
    out.update(
        time=np.asarray(report["ts"], np.float64),
        scores=np.asarray(z, np.float64),
        rho_stationary=np.asarray(report["stationary"], np.float64),
        rho_final=np.asarray(report["rho_final"], np.float64),
        rho_dot_final=np.asarray(report["rho_dot_final"], np.float64),
        t_final=np.asarray(report["t_final"], np.float64),
        constraint_drift=np.asarray(report["constraint_drift"], np.float64),
        num_steps=np.asarray(report["num_steps"], np.int32),
        result=np.asarray(report["result"], np.int32),
    )
    return out


def _dataset(arrays, options, names):
    import numpy as np

    from .._optional import require

    xr = require("xarray", extra="cli", what="simulate --save .nc")

    codes = sorted(names["results"].items(), key=lambda kv: int(kv[0]))
    result = int(arrays["result"])
    per_key = {
        "scores": "the scores z_i",
        "rho_stationary": "fisherdyn.stationary of the scores: the fixed point",
        "rho_final": "the weights where the solve stopped",
        "rho_dot_final": "the velocities where the solve stopped",
    }
    data = {
        k: (("time", "key") if arrays[k].ndim == 2 else ("time",), arrays[k], {"long_name": d})
        for k, d in _PER_TIME.items()
    }
    data.update({k: (("key",), arrays[k], {"long_name": d}) for k, d in per_key.items()})
    data.update(
        t_final=((), arrays["t_final"], {"long_name": "the time where the solve stopped"}),
        constraint_drift=((), arrays["constraint_drift"],
                          {"long_name": "max drift of the chart's constraint"}),
        num_steps=((), arrays["num_steps"], {"long_name": "solver steps"}),
        result=(
            (),
            arrays["result"],
            {
                "long_name": "fisherdyn.RESULTS code of the run",
                "flag_values": np.array([int(k) for k, _ in codes], np.int32),
                "flag_meanings": " ".join(v for _, v in codes),
            },
        ),
    )
    coords = {
        "time": ("time", arrays["time"],
                 {"long_name": "save times (inf past an early stop)"}),
        "key": ("key", np.arange(arrays["scores"].shape[-1], dtype=np.int32)),
    }
    attrs = {
        "title": "fisherdyn simulate trajectory",
        "result_name": names["results"][str(result)],
        "options": json.dumps(options),
        **{k: v for k, v in options.items()},
    }
    return xr.Dataset(data, coords=coords, attrs=attrs)


def save_trajectory(path: Path, report: dict, names: dict, args, z) -> None:
    """Write the report of one `simulate` run (a dict of arrays) to `path` (.nc or .npz)."""
    import numpy as np

    arrays = _arrays(report, z)
    options = _options(args, z)
    result_name = names["results"][str(int(arrays["result"]))]
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix.lower() == ".npz":
        with open(path, "wb") as f:  # a file object: np.savez keeps the name given
            np.savez(f, **arrays, result_name=np.array(result_name),
                     options=np.array(json.dumps(options)))
        return
    _dataset(arrays, options, names).to_netcdf(path, engine="scipy")
