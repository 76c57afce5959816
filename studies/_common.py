"""Shared plumbing of the study scripts: arguments, comparisons, output files, plot styling.

No mathematics lives here (that is the library's job): only the command line every study
shares (`--quick`, `--out DIR`), a small ledger that prints measured values next to the
predicted ones and flags every disagreement, and the writers of `<study>.png` /
`<study>.json`.

The JSON is byte-reproducible on one setup: it records where it was computed (the
`provenance` block: fisherdyn, JAX and jaxlib versions, device, precision) but no timestamps
and no wall-clock timings, which are printed instead.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import math
import platform
import sys
import time
from pathlib import Path

import numpy as np


def setup(name: str, description: str, argv=None, add_arguments=None):
    """Parse `--quick` / `--out DIR` (and the study's own options: `add_arguments(parser)`),
    switch JAX to float64 and matplotlib to Agg.

    Returns (args, ledger)."""
    # a study that is a package runs as its folder, `studies/<name>`
    package = (Path(__file__).resolve().parent / name).is_dir()
    p = argparse.ArgumentParser(prog=f"studies/{name}" + ("" if package else ".py"),
                                description=description)
    p.add_argument("--quick", action="store_true",
                   help="small grids and fewer families: seconds, for the test suite")
    p.add_argument("--out", type=Path, default=Path("figures"),
                   help="directory for <study>.png and <study>.json (default figures/)")
    if add_arguments is not None:
        add_arguments(p)
    args = p.parse_args(argv)
    import jax

    jax.config.update("jax_enable_x64", True)  # every study verifies in float64
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({
        "figure.dpi": 110, "axes.grid": True, "grid.alpha": 0.3, "axes.titlesize": 10,
        "axes.labelsize": 9, "legend.fontsize": 7.5, "xtick.labelsize": 8,
        "ytick.labelsize": 8,
    })
    args.out.mkdir(parents=True, exist_ok=True)
    ledger = Ledger(name, quick=args.quick)
    print(f"[{name}] {'quick' if args.quick else 'full'} mode -> {args.out}/", flush=True)
    return args, ledger


# --------------------------------------------------------------------------- comparisons


class Ledger:
    """Measured-vs-predicted comparisons of one study, printed and stored in its JSON.

    `check` records a value that theory predicts (a disagreement beyond `tol` is printed as
    `DISAGREES`, never dropped); `note` records a measured value without a prediction;
    `headline` marks the values the README gallery quotes (formatted once, here).
    """

    def __init__(self, name, quick=False):
        self.name = name
        self.quick = quick
        self.rows: list[dict] = []
        self.headlines: dict[str, str] = {}
        self.timings: dict[str, float] = {}
        self.t0 = time.perf_counter()

    def check(self, key, measured, predicted, *, tol, kind="abs", fmt=".4g", explain=""):
        """Compare: `kind="abs"`: |m - p| <= tol; `"rel"`: |m - p| <= tol |p|;
        `"max"`: m <= tol, `"min"`: m >= tol (predicted shown for reference)."""
        m = float(measured)
        p = float(predicted) if predicted is not None else float("nan")
        if kind == "abs":
            ok = abs(m - p) <= tol
        elif kind == "rel":
            ok = abs(m - p) <= tol * abs(p)
        elif kind == "max":
            ok = m <= tol
        elif kind == "min":
            ok = m >= tol
        else:
            raise ValueError(kind)
        ok = bool(ok and math.isfinite(m))
        self.rows.append(dict(key=key, measured=m, predicted=p if math.isfinite(p) else None,
                              tol=tol, kind=kind, ok=ok, explain=explain, fmt=fmt))
        return ok

    def note(self, key, measured, *, fmt=".4g", explain=""):
        self.rows.append(dict(key=key, measured=float(measured), predicted=None, tol=None,
                              kind="note", ok=True, explain=explain, fmt=fmt))

    def headline(self, key, text):
        self.headlines[key] = text

    def timing(self, key, seconds):
        """Record a wall-clock time: printed with the summary, never stored in the JSON."""
        self.timings[key] = float(seconds)

    @property
    def disagreements(self):
        return [r for r in self.rows if not r["ok"]]

    def print_summary(self):
        print(f"\n[{self.name}] measured vs predicted")
        width = max([len(r["key"]) for r in self.rows] + [8])
        for r in self.rows:
            f = r["fmt"]
            m = format(r["measured"], f)
            if r["kind"] == "note":
                line = f"  {r['key']:<{width}}  {m:>12}  {'(measured)':>12}"
            else:
                p = "" if r["predicted"] is None else format(r["predicted"], f)
                rel = {"abs": "+-", "rel": "+-rel", "max": "<=", "min": ">="}[r["kind"]]
                status = "ok" if r["ok"] else "DISAGREES"
                line = (f"  {r['key']:<{width}}  {m:>12}  {p:>12}  ({rel} {r['tol']:.1g})"
                        f"  {status}")
            if r["explain"]:
                line += f"  [{r['explain']}]"
            print(line)
        bad = self.disagreements
        if bad:
            print(f"[{self.name}] {len(bad)} DISAGREEMENT(S) with theory beyond tolerance:")
            for r in bad:
                print(f"    {r['key']}: measured {r['measured']:.6g}, predicted "
                      f"{r['predicted']}, tol {r['tol']:.1g} ({r['kind']})")
        else:
            print(f"[{self.name}] all {sum(r['kind'] != 'note' for r in self.rows)} "
                  "checks agree with theory within tolerance")
        for key, seconds in self.timings.items():
            print(f"[{self.name}] {key}: {seconds:.1f} s")
        print(f"[{self.name}] done in {time.perf_counter() - self.t0:.1f} s", flush=True)


# --------------------------------------------------------------------------- output


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (str, bool)) or x is None:
        return x
    if isinstance(x, (int, np.integer)):
        return int(x)
    a = np.asarray(x)
    if a.dtype == bool:
        return a.tolist()
    if np.iscomplexobj(a):
        return _jsonable({"re": a.real, "im": a.imag})
    if a.ndim == 0:
        v = float(a)
        return v if math.isfinite(v) else None
    return [_jsonable(v) for v in a]


def _version(dist):
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def provenance() -> dict:
    """Where the numbers were computed: package versions, device and floating-point precision.

    Deliberately no date, host name or timing, so that a rerun on the same setup writes the
    same bytes."""
    import jax
    import jax.numpy as jnp

    import fisherdyn as fd

    dev = jax.devices()[0]
    return dict(
        fisherdyn=getattr(fd, "__version__", None) or _version("fisherdyn"),
        jax=jax.__version__,
        jaxlib=_version("jaxlib"),
        numpy=np.__version__,
        python=platform.python_version(),
        platform=dev.platform,
        device_kind=dev.device_kind,
        device_count=jax.device_count(),
        jax_enable_x64=bool(jax.config.jax_enable_x64),
        dtype=str(jnp.asarray(1.0).dtype),
    )


def _is_timing(key: str) -> bool:
    # wall-clock seconds vary from run to run: they go to stdout, not into the JSON
    return key == "seconds" or key.endswith("_seconds") or key.startswith("seconds ")


def _split_timings(x, path=""):
    """`x` without its timing entries, and those entries as {dotted path: value}."""
    if isinstance(x, dict):
        kept, timings = {}, {}
        for k, v in x.items():
            where = f"{path}.{k}" if path else str(k)
            if _is_timing(str(k)):
                timings[where] = v
            else:
                kept[k], sub = _split_timings(v, where)
                timings |= sub
        return kept, timings
    if isinstance(x, (list, tuple)):
        pairs = [_split_timings(v, f"{path}[{i}]") for i, v in enumerate(x)]
        return [p[0] for p in pairs], {k: v for p in pairs for k, v in p[1].items()}
    return x, {}


def write_outputs(args, ledger: Ledger, fig, *, title, caption, data, png_name=None,
                  images=None):
    """Save `fig` as `<out>/<study>.png` (or `png_name`) and `<out>/<study>.json`; print the
    summary. `images`: every figure file the study wrote (default: just this one), listed in
    the JSON for the gallery.

    The JSON starts with the `provenance` block; timings (`Ledger.timing`, and any entry of
    `data` or ledger note whose key is `seconds`, ends in `_seconds` or starts with
    `seconds `) are printed, not stored."""
    import matplotlib.pyplot as plt

    png = args.out / (png_name or f"{ledger.name}.png")
    fig.savefig(png, dpi=110)
    plt.close(fig)
    for r in ledger.rows:
        if r["kind"] == "note" and _is_timing(r["key"]):
            ledger.timing(r["key"], r["measured"])
    ledger.rows = [r for r in ledger.rows if not (r["kind"] == "note" and _is_timing(r["key"]))]
    data, timings = _split_timings(data)
    for key, value in timings.items():
        print(f"[{ledger.name}] {key} (not stored): {value}")
    payload = dict(
        study=ledger.name,
        quick=ledger.quick,
        provenance=provenance(),
        title=title,
        caption=caption,
        images=list(images or [png.name]),
        headline=ledger.headlines,
        comparisons=[{k: v for k, v in r.items() if k != "fmt"} for r in ledger.rows],
        disagreements=len(ledger.disagreements),
        data=data,
    )
    (args.out / f"{ledger.name}.json").write_text(json.dumps(_jsonable(payload), indent=1) + "\n")
    ledger.print_summary()
    print(f"[{ledger.name}] wrote {png} and {args.out / (ledger.name + '.json')}")
    sys.stdout.flush()


# --------------------------------------------------------------------------- plot styling

# one color per family label, the same in every figure
_COLORS = {
    "Shannon": "#1f77b4",
    "Tsallis": "#d62728",
    "Renyi": "#ff7f0e",
    "SharmaMittal": "#8c564b",
    "Kaniadakis": "#2ca02c",
    "Burg": "#9467bd",
    "Abe": "#e377c2",
}


def label(entropy) -> str:
    """`Kaniadakis(0.3)`-style name of an entropy instance."""
    params = [f"{float(np.asarray(v)):g}" for v in entropy.parameters.values()]
    return type(entropy).__name__ + (f"({', '.join(params)})" if params else "")


def color(entropy, shade=0):
    """The family's color; `shade` in [0, 1) darkens it for a second member of a family."""
    import matplotlib.colors as mc

    base = np.array(mc.to_rgb(_COLORS.get(type(entropy).__name__, "#7f7f7f")))
    return tuple(base * (1 - 0.45 * shade))


def draw_table(ax, header, rows, *, fontsize=7.5, col_widths=None, title=None,
               bbox=(0.0, 0.0, 1.0, 0.96)):
    """A plain text table filling `bbox` of `ax` (axes coordinates; axis switched off)."""
    ax.axis("off")
    tab = ax.table(cellText=rows, colLabels=header, cellLoc="left", colWidths=col_widths,
                   bbox=list(bbox))
    tab.auto_set_font_size(False)
    tab.set_fontsize(fontsize)
    for (r, _), cell in tab.get_celld().items():
        cell.set_linewidth(0.3)
        if r == 0:
            cell.set_text_props(weight="bold")
            cell.set_facecolor("#eeeeee")
    if title:
        ax.set_title(title, fontsize=9)
    return tab


def loglog_slope(x, y):
    """Least-squares slope (and intercept) of log y against log x."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    ok = (x > 0) & (y > 0) & np.isfinite(x) & np.isfinite(y)
    b, a = np.polyfit(np.log(x[ok]), np.log(y[ok]), 1)
    return float(b), float(a)
