"""`fisherdyn figures`: run every study script in `studies/` and regenerate `figures/`.

Each study is a stand-alone script (`studies/<name>.py [--quick] [--out DIR]`) that calls
only the public API and writes `<out>/<name>.png` and `<out>/<name>.json`. This module
runs them as subprocesses (`sys.executable`, so the same environment), a few at a time,
with a tqdm progress bar, prints each study's measured-vs-predicted summary as it
finishes, and ends with one line per study (time, checks, disagreements with theory).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from ._main import register_command

__all__ = ["STUDIES", "run_all", "studies_dir", "gallery_markdown"]

# in the order of the paper's argument
STUDIES = (
    "stationary_laws",
    "tails",
    "tangent_test",
    "abe_even_order",
    "renyi_temperature",
    "relaxation",
    "entropy_invariance",
    "weight_tied",
)


# the longest first, so that `jobs` workers finish together
_LONGEST_FIRST = ("weight_tied", "stationary_laws", "relaxation", "entropy_invariance",
                  "renyi_temperature", "tangent_test", "abe_even_order", "tails")


def studies_dir() -> Path:
    """The `studies/` folder of the source checkout (next to the `fisherdyn` package)."""
    path = Path(__file__).resolve().parent.parent / "studies"
    if not path.is_dir():
        raise FileNotFoundError(
            f"no studies/ folder at {path}: `fisherdyn figures` runs from a source checkout "
            "(pip install -e .)"
        )
    return path


def _run_one(name, quick, out: Path):
    script = studies_dir() / f"{name}.py"
    cmd = [sys.executable, str(script), "--out", str(out)] + (["--quick"] if quick else [])
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=script.parent.parent)
    seconds = time.perf_counter() - t0
    summary = dict(name=name, returncode=proc.returncode, seconds=seconds,
                   stdout=proc.stdout, stderr=proc.stderr, checks=None, disagreements=None)
    result = out / f"{name}.json"
    if proc.returncode == 0 and result.is_file():
        data = json.loads(result.read_text())
        summary["checks"] = sum(r["kind"] != "note" for r in data["comparisons"])
        summary["disagreements"] = data["disagreements"]
    return summary


def run_all(quick: bool = False, out="figures", only=None, jobs: int | None = None) -> dict:
    """Run the study scripts and write their figures and numbers to `out`.

    **Arguments:**
    - `quick`: pass `--quick` to every study (small grids: seconds each, as in the tests).
    - `out`: output folder (created), default `figures/` relative to the current directory.
    - `only`: a study name or a list of names (default: all of `STUDIES`).
    - `jobs`: how many studies run at once (default: 2, or 1 on a single core).

    **Returns:** `{name: {"returncode", "seconds", "checks", "disagreements", ...}}`.
    """
    from tqdm import tqdm

    names = list(STUDIES) if only is None else ([only] if isinstance(only, str) else list(only))
    unknown = [n for n in names if n not in STUDIES]
    if unknown:
        raise ValueError(f"unknown study {unknown[0]!r}; choose from {', '.join(STUDIES)}")
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    jobs = jobs or max(1, min(2, os.cpu_count() or 1))
    results = {}
    t0 = time.perf_counter()
    with tqdm(total=len(names), desc="fisherdyn figures", unit="study") as bar, \
            ThreadPoolExecutor(max_workers=jobs) as pool:
        ordered = sorted(names, key=_LONGEST_FIRST.index)
        futures = {pool.submit(_run_one, n, quick, out): n for n in ordered}
        for fut in as_completed(futures):
            res = fut.result()
            results[res["name"]] = res
            bar.write(res["stdout"].rstrip())
            if res["returncode"] != 0:
                bar.write(f"[{res['name']}] FAILED (exit {res['returncode']}):\n"
                          + res["stderr"][-4000:])
            bar.set_postfix_str(f"{res['name']} {res['seconds']:.0f}s")
            bar.update(1)
    total = time.perf_counter() - t0
    print(f"\n{'study':<20} {'time':>7}  result")
    for n in names:
        r = results[n]
        if r["returncode"] != 0:
            status = f"FAILED (exit {r['returncode']})"
        elif r["disagreements"]:
            status = f"{r['disagreements']} of {r['checks']} checks DISAGREE with theory"
        else:
            status = f"all {r['checks']} checks agree with theory"
        print(f"{n:<20} {r['seconds']:>6.0f}s  {status}")
    print(f"{'total':<20} {total:>6.0f}s  ({'quick' if quick else 'full'} mode, {jobs} at a "
          f"time) -> {out}")
    return results


def gallery_markdown(out="figures", image_prefix="figures/") -> str:
    """The README gallery section, from the studies' JSON files in `out`: per figure its
    image, the one-sentence caption and the headline numbers (verbatim from the JSON)."""
    out = Path(out)
    lines = ["## Gallery", "",
             "Every figure is regenerated by `fisherdyn figures` (or `make figures`) from the "
             "study scripts in `studies/`; the numbers below are copied from the JSON written "
             "beside each figure.", ""]
    for name in STUDIES:
        path = out / f"{name}.json"
        if not path.is_file():
            continue
        data = json.loads(path.read_text())
        lines += [f"### {data['title']} (`studies/{name}.py`)", "",
                  *(f"![{data['title']}]({image_prefix}{img})"
                    for img in data.get("images", [f"{name}.png"])), "", data["caption"], ""]
        lines += [f"- {text}" for text in data["headline"].values()]
        lines.append("")
    return "\n".join(lines)


def _configure(p):
    p.add_argument("--quick", action="store_true",
                   help="small grids (seconds per study), as run by the test suite")
    p.add_argument("--only", action="append", choices=STUDIES, metavar="NAME",
                   help="run only this study (repeatable): " + ", ".join(STUDIES))
    p.add_argument("--out", type=Path, default=Path("figures"),
                   help="output folder for <study>.png/.json (default figures/)")
    p.add_argument("--jobs", type=int, default=None,
                   help="studies run at once (default 2, or 1 on a single core)")
    p.add_argument("--gallery", action="store_true",
                   help="print the README gallery (markdown) from the JSON files in --out "
                   "instead of running the studies")


@register_command(
    "figures",
    help="regenerate every figure of the paper's argument from the study scripts",
    configure=_configure,
)
def _figures_cmd(args) -> int:
    if args.gallery:
        print(gallery_markdown(args.out))
        return 0
    if args.jobs is not None and args.jobs < 1:
        args._parser.error(f"argument --jobs: must be >= 1, got {args.jobs}")
    results = run_all(quick=args.quick, out=args.out, only=args.only, jobs=args.jobs)
    return 0 if all(r["returncode"] == 0 for r in results.values()) else 1
