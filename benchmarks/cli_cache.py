"""The persistent compilation cache of the command line: `fisherdyn simulate` in a new
process, first with an empty cache (it compiles and fills it), then again (it loads), side by
side with the cache switched off; and `fisherdyn --help`.

Each command runs in a fresh interpreter, timed end to end (interpreter start-up included);
the rounds alternate cold and warm, and medians of `--repeat` rounds are printed.

    python benchmarks/cli_cache.py [--repeat 3]
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
    p.add_argument("--repeat", type=int, default=3, help="rounds (each: cold, warm, off)")
    args = p.parse_args(argv)
    times = {"help": [], "off": [], "cold": [], "warm": []}
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory() as cache:
            times["help"].append(_run(["--help"], FISHERDYN_CACHE=cache))
            times["off"].append(_run(SIMULATE, FISHERDYN_NO_COMPILATION_CACHE="1"))
            times["cold"].append(_run(SIMULATE, FISHERDYN_CACHE=cache))
            times["warm"].append(_run(SIMULATE, FISHERDYN_CACHE=cache))
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"fisherdyn {' '.join(SIMULATE)}  (median of {args.repeat}, wall s)")
    print(f"  cache off          {med['off']:7.2f}")
    print(f"  first (cold cache) {med['cold']:7.2f}")
    print(f"  second (warm)      {med['warm']:7.2f}   = {med['warm'] / med['cold']:.0%} of the first"
          f" (goal <= 40 %), {med['warm'] / med['off']:.0%} of cache off")
    print(f"fisherdyn --help     {med['help']:7.2f}   (goal <= 0.3 s)")


if __name__ == "__main__":
    main()
