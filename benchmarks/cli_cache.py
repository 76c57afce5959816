"""The persistent compilation cache of the command line: `fisherdyn simulate` and
`fisherdyn sweep` in a new process, first with an empty cache (it compiles and fills it),
then again (it loads), side by side with the cache switched off; and `fisherdyn --help`.

JAX does not persist programs that contain host callbacks, which is what Equinox's runtime
checks (`eqx.error_if`) lower to by default; `fisherdyn sweep` sets `EQX_ON_ERROR=nan`, and
the `simulate (EQX_ON_ERROR=nan)` rows show what the same would give `simulate`.

Each command runs in a fresh interpreter, timed end to end (interpreter start-up included);
the rounds alternate cold and warm, and medians of `--repeat` rounds are printed.

    python benchmarks/cli_cache.py [--repeat 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIMULATE = ["simulate", "--scores", "1.3,0.2,-0.7", "--T", "0.8", "--t1", "20"]
SPEC = """\
families = ["shannon", "tsallis:1.5"]
T = [0.5, 1.0]
mass = [1.0]
damping = [0.5]
n_keys = [8]
seeds = 4
"""


def _run(args, **env_extra) -> float:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env.pop("FISHERDYN_NO_COMPILATION_CACHE", None)
    env.update(env_extra)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "fisherdyn", *args], check=True, env=env,
                   capture_output=True)
    return time.perf_counter() - t0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=2, help="rounds (each: off, cold, warm)")
    args = p.parse_args(argv)
    cases = {
        "simulate": (SIMULATE, {}),
        "simulate (EQX_ON_ERROR=nan)": (SIMULATE, {"EQX_ON_ERROR": "nan"}),
        "sweep (16 problems, 2 families)": (None, {}),
    }
    times = {(name, k): [] for name in cases for k in ("off", "cold", "warm")}
    times["help"] = []
    with tempfile.TemporaryDirectory() as work:
        spec = Path(work) / "spec.toml"
        spec.write_text(SPEC)
        for r in range(args.repeat):
            for name, (argv, env) in cases.items():
                with tempfile.TemporaryDirectory() as cache:
                    for k in ("off", "cold", "warm"):
                        run = argv or ["sweep", str(spec), "--out",
                                       f"{work}/{r}-{k}.zarr", "--no-progress", "--no-figure"]
                        extra = dict(env, FISHERDYN_CACHE=cache)
                        if k == "off":
                            extra["FISHERDYN_NO_COMPILATION_CACHE"] = "1"
                        times[(name, k)].append(_run(run, **extra))
            times["help"].append(_run(["--help"]))
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"median of {args.repeat} rounds, wall s, each in a new process "
          f"(simulate: fisherdyn {' '.join(SIMULATE)})")
    for name in cases:
        off, cold, warm = (med[(name, k)] for k in ("off", "cold", "warm"))
        print(f"  {name:32s} cache off {off:6.2f}  first {cold:6.2f}  second {warm:6.2f}"
              f"  = {warm / cold:4.0%} of the first (goal <= 40 %)")
    print(f"  fisherdyn --help {med['help']:.2f} s (goal <= 0.3 s)")

if __name__ == "__main__":
    main()
