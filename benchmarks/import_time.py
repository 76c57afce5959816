"""Import time of fisherdyn against that of the libraries it is built on.

Each statement runs in a fresh interpreter (`sys.executable`), timed inside it from before
the import to after (interpreter start-up excluded); the runs of the statements alternate,
and the median of `--repeat` runs of each is printed, with the ratios to the baseline.

    python benchmarks/import_time.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys

BASELINE = "import jax, equinox, diffrax"
STATEMENTS = {
    "baseline": BASELINE,
    "import": "import fisherdyn",
    # first use of a name from the core subpackages
    "core": "import fisherdyn as fd; fd.RESULTS, fd.Shannon, fd.stationary, fd.simulate, "
    "fd.relaxation_spectrum, fd.attention, fd.tangent_test, fd.operator_table",
}
_TIMER = "import time; _t0 = time.perf_counter(); {stmt}; print(time.perf_counter() - _t0)"


def _time(stmt: str) -> float:
    out = subprocess.run([sys.executable, "-c", _TIMER.format(stmt=stmt)], check=True,
                         capture_output=True, text=True)
    return float(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=5, help="fresh processes per statement")
    args = p.parse_args(argv)
    times = {key: [] for key in STATEMENTS}
    for _ in range(args.repeat):
        for key, stmt in STATEMENTS.items():
            times[key].append(_time(stmt))
    median = {key: statistics.median(ts) for key, ts in times.items()}
    for key, stmt in STATEMENTS.items():
        ratio = median[key] / median["baseline"]
        print(f"{median[key]:7.3f} s  ({ratio:4.2f} x baseline)  {stmt}")
    print(f"median of {args.repeat} fresh processes each; baseline: {BASELINE}")


if __name__ == "__main__":
    main()
