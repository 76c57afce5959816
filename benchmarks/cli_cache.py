"""The persistent caches of the command line: `fisherdyn simulate` and `fisherdyn sweep` in
a new process, first with an empty cache (it compiles and fills it), then again (it loads),
side by side with the cache switched off; `fisherdyn run` (make run's main job, figures
included) from an empty cache, with the time to its first line; and `fisherdyn --help`.

JAX does not persist programs that contain host callbacks, which is what Equinox's runtime
checks (`eqx.error_if`) lower to by default; `fisherdyn sweep` sets `EQX_ON_ERROR=nan`, and
the `simulate (EQX_ON_ERROR=nan)` rows show what the same would give `simulate`.

Each command runs in a fresh interpreter, timed end to end (interpreter start-up included);
the rounds alternate cold and warm, and medians of `--repeat` rounds are printed.

    python benchmarks/cli_cache.py [--repeat 2] [--no-run]
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


def _env(**extra) -> dict:
    """This checkout's package on the path, the cache on unless `extra` switches it off."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env.pop("FISHERDYN_NO_COMPILATION_CACHE", None)
    env.update(extra)
    return env


def _run(args, **env_extra) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "fisherdyn", *args], check=True,
                   env=_env(**env_extra), capture_output=True)
    return time.perf_counter() - t0


def _run_command(cache, figures) -> tuple[float, float]:
    """`fisherdyn run` in a new process with an empty cache: (seconds to its first line of
    output, seconds to its end)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "fisherdyn", "run", "--figures-dir", figures],
                            env=_env(FISHERDYN_CACHE=cache), stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    proc.stdout.readline()
    first = time.perf_counter() - t0
    proc.stdout.read()
    if proc.wait() != 0:
        raise RuntimeError("fisherdyn run failed")
    return first, time.perf_counter() - t0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=2, help="rounds (each: off, cold, warm)")
    p.add_argument("--no-run", action="store_true", help="leave out `fisherdyn run`")
    args = p.parse_args(argv)
    cases = {
        "simulate": (SIMULATE, {}),
        "simulate (EQX_ON_ERROR=nan)": (SIMULATE, {"EQX_ON_ERROR": "nan"}),
        "sweep (16 problems, 2 families)": (None, {}),
    }
    times = {(name, k): [] for name in cases for k in ("off", "cold", "warm")}
    times["help"], times["run"] = [], []
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
            if not args.no_run:
                with tempfile.TemporaryDirectory() as cache:
                    times["run"].append(_run_command(cache, f"{work}/figures"))
    med = {k: statistics.median(v) for k, v in times.items() if k != "run"}
    print(f"median of {args.repeat} rounds, wall s, each in a new process "
          f"(simulate: fisherdyn {' '.join(SIMULATE)})")
    for name in cases:
        off, cold, warm = (med[(name, k)] for k in ("off", "cold", "warm"))
        print(f"  {name:32s} cache off {off:6.2f}  first {cold:6.2f}  second {warm:6.2f}"
              f"  = {warm / cold:4.0%} of the first (goal <= 40 %)")
    print(f"  fisherdyn --help {med['help']:.2f} s (goal <= 0.3 s)")
    if times["run"]:
        first = statistics.median(f for f, _ in times["run"])
        total = statistics.median(t for _, t in times["run"])
        print(f"  fisherdyn run, empty cache: {total:.1f} s (goal <= 45 s), first line after "
              f"{first:.1f} s (goal <= 2 s); {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
