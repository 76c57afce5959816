"""The options of `fisherdyn run`, `simulate` and `sweep`, and their argument types.

Nothing here imports JAX at module level, so that `--help` and usage errors answer at once;
an entropy argument imports the library when it is parsed.
"""

from __future__ import annotations

import argparse
import math
import warnings
from pathlib import Path

__all__ = [
    "configure_run",
    "configure_simulate",
    "configure_sweep",
    "check_simulate",
    "check_sweep",
    "check_outputs",
    "output_path_error",
    "enable_x64",
]

DEFAULT_SCORES = [1.3, 0.2, -0.7, 0.5, -1.6, 0.9]
DEFAULT_T = 0.8
DEFAULT_RUN_DIR = Path("run")


def enable_x64():
    """Switch JAX to float64 before any array is made: the commands verify in float64."""
    import jax

    jax.config.update("jax_enable_x64", True)


# --------------------------------------------------------------------------- argument types


def _number(name, *, positive=False, nonneg=False):
    def parse(text):
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be finite, got {text!r}")
        if positive and not value > 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        if nonneg and not value >= 0:
            raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
        return value

    parse.__name__ = name
    return parse


def _int_at_least(low):
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value

    return parse


_positive_int = _int_at_least(1)


def entropy_arg(text):
    """An entropy spec such as `kaniadakis:0.3`, parsed by `fisherdyn.parse_entropy`."""
    enable_x64()
    from .._entropies import parse_entropy

    try:
        return parse_entropy(text)
    except (ValueError, TypeError) as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def vector_arg(text):
    """Comma-separated finite numbers, at least two, no empty entry."""
    entries = text.replace(" ", "").split(",")
    if "" in entries:
        raise argparse.ArgumentTypeError(f"empty entry in {text!r} (write e.g. '1.3,0.2,-0.7')")
    try:
        values = [float(v) for v in entries]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated numbers such as '1.3,0.2,-0.7', got {text!r}"
        ) from None
    if len(values) < 2 or not all(math.isfinite(v) for v in values):
        raise argparse.ArgumentTypeError(f"expected at least 2 finite numbers, got {text!r}")
    return values


def existing_file(text):
    """The path of a file that exists."""
    path = Path(text)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"no such file: {text}")
    return path


def scores_file_arg(text):
    """One vector of scores from a `.npy` file or a comma-separated text file."""
    import numpy as np

    path = existing_file(text)
    if path.suffix != ".npy" and not path.read_text(errors="replace").strip():
        raise argparse.ArgumentTypeError(f"{text} is empty")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # numpy's "no data" warning: the error below says it
            if path.suffix == ".npy":
                values = np.load(path)
            else:
                values = np.loadtxt(path, delimiter=",", ndmin=1)
    except Exception as e:  # unreadable content: say so, in one line
        raise argparse.ArgumentTypeError(f"cannot read {text}: {e}".splitlines()[0]) from None
    values = np.asarray(values, float)
    if values.ndim != 1:
        raise argparse.ArgumentTypeError(
            f"{text} must hold one vector of scores, got an array of shape {values.shape}"
        )
    if values.size < 2 or not np.all(np.isfinite(values)):
        raise argparse.ArgumentTypeError(f"{text} must hold at least 2 finite scores")
    return values.tolist()


def figure_arg(text):
    if Path(text).suffix.lower() not in (".png", ".pdf", ".svg"):
        raise argparse.ArgumentTypeError(f"must end in .png, .pdf or .svg, got {text!r}")
    return Path(text)


# --------------------------------------------------------------------------- fisherdyn run


_EXIT_COMMON = (
    "2: a bad argument or an output path that cannot be written (checked before computing); "
    "130: interrupted (Ctrl-C); 141: the reader of the output went away (as in `| head`)."
)


def configure_run(p: argparse.ArgumentParser):
    p.epilog = (
        "Exit status: 0: every fixed point matches stationary and solve_stationary; 1: some "
        "do not (the FAILED line counts them); " + _EXIT_COMMON
    )
    p.add_argument(
        "--family",
        action="append",
        type=entropy_arg,
        metavar="SPEC",
        help="entropy to check, e.g. 'kaniadakis:0.3' (repeat for several; default: every "
        "family at its default parameters, and sparsemax, tsallis:2)",
    )
    p.add_argument(
        "--scores",
        type=vector_arg,
        default=DEFAULT_SCORES,
        help=f"comma-separated scores (default {','.join(map(str, DEFAULT_SCORES))})",
    )
    p.add_argument(
        "--T",
        type=_number("T", positive=True),
        default=DEFAULT_T,
        help=f"temperature > 0 (default {DEFAULT_T})",
    )
    p.add_argument(
        "--mass",
        type=_number("mass", positive=True),
        default=1.0,
        help="mass m > 0 of the inertial runs (default 1)",
    )
    p.add_argument(
        "--figures-dir",
        type=Path,
        default=DEFAULT_RUN_DIR,
        help=f"where to write relaxation_paths.png and energy.png (default {DEFAULT_RUN_DIR}/ "
        "in the current directory)",
    )
    p.add_argument("--no-figures", action="store_true", help="skip the figures")
    p.add_argument(
        "--no-operator-table",
        action="store_true",
        help="skip the operator table (support, tail and agreement of each family's "
        "stationary operator), printed after the relaxed families and before the relaxation "
        "table",
    )


# --------------------------------------------------------------------------- fisherdyn simulate


def configure_simulate(p: argparse.ArgumentParser):
    p.epilog = (
        "Exit status: 0: integrated to --t1; 1: stopped before --t1, for any reason "
        "(max_steps_reached, boundary_reached, ...): the summary of the part computed is "
        "printed, and one line on stderr names the reason and what to do; " + _EXIT_COMMON
    )
    from ._save import add_save_option

    _problem_options(p)
    _solver_options(p)
    _output_options(p)
    add_save_option(p)


def _problem_options(p):
    p.add_argument(
        "--entropy",
        type=entropy_arg,
        default=None,  # Shannon, made after parsing so that a usage error needs no JAX
        help="entropy family and parameters, e.g. shannon, tsallis:2, kaniadakis:0.3, "
        "renyi:2, sharma_mittal:2,1.5, burg, abe:1.5 (default shannon)",
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument(
        "--scores",
        type=vector_arg,
        default=None,
        help=f"comma-separated scores (default {','.join(map(str, DEFAULT_SCORES))})",
    )
    src.add_argument(
        "--scores-file",
        type=scores_file_arg,
        default=None,
        help="scores from a .npy or .csv file (one vector)",
    )
    p.add_argument(
        "--T", type=_number("T", positive=True), default=1.0, help="temperature > 0 (default 1)"
    )
    p.add_argument(
        "--mass",
        type=_number("mass", nonneg=True),
        default=1.0,
        help="mass m >= 0; 0 integrates the overdamped replicator flow (default 1)",
    )
    p.add_argument(
        "--damping",
        type=_number("damping", nonneg=True),
        default=1.0,
        help="damping gamma >= 0 (> 0 when m = 0) (default 1)",
    )
    p.add_argument(
        "--t1", type=_number("t1", positive=True), default=50.0, help="final time (default 50)"
    )
    p.add_argument(
        "--rho0",
        type=vector_arg,
        default=None,
        help="initial weights, comma-separated, on the simplex (default uniform)",
    )


def _solver_options(p):
    p.add_argument(
        "--coords",
        choices=["sphere", "simplex"],
        default="sphere",
        help="chart: sphere (x = sqrt(rho), default) or simplex",
    )
    p.add_argument(
        "--solver",
        choices=["tsit5", "dopri5", "dopri8", "kvaerno5"],
        default="tsit5",
        help="diffrax solver (kvaerno5: stiff, implicit)",
    )
    p.add_argument(
        "--rtol",
        type=_number("rtol", positive=True),
        default=1e-8,
        help="relative tolerance (default 1e-8)",
    )
    p.add_argument(
        "--atol",
        type=_number("atol", positive=True),
        default=1e-10,
        help="absolute tolerance (default 1e-10)",
    )
    p.add_argument(
        "--max-steps",
        type=_positive_int,
        default=100_000,
        help="the solver's step budget (default 100000)",
    )


def _output_options(p):
    p.add_argument("--n-save", type=int, default=501, help="number of saved times (default 501)")
    p.add_argument(
        "--out",
        type=figure_arg,
        default=None,
        help="write a figure of rho_i(t) and H(t) to this .png/.pdf/.svg",
    )
    p.add_argument(
        "--json", action="store_true", help="print the trajectory summary as JSON instead of text"
    )
    p.add_argument("--progress", action="store_true", help="show a progress bar")


def check_simulate(args: argparse.Namespace, parser: argparse.ArgumentParser):
    """The checks that relate several options (`parser.error`, exit 2, on a failure)."""
    n = len(args.scores_file or args.scores or DEFAULT_SCORES)
    if args.mass == 0 and args.damping == 0:
        parser.error("argument --damping: must be > 0 when --mass is 0 (overdamped flow)")
    if args.n_save < 2:
        parser.error(f"argument --n-save: must be >= 2, got {args.n_save}")
    if args.rho0 is not None:
        if len(args.rho0) != n:
            parser.error(
                f"argument --rho0: needs {n} weights (one per score), got {len(args.rho0)}"
            )
        if min(args.rho0) < 0 or abs(math.fsum(args.rho0) - 1) > 1e-9 * n:
            parser.error("argument --rho0: must lie on the simplex (>= 0, summing to 1)")


# --------------------------------------------------------------------------- output paths


def output_path_error(path, *, directory: bool = False) -> str | None:
    """Why `path` cannot be written (a file, or with `directory` a directory to create or
    fill), or None: its nearest existing ancestor must be a directory in which a file can be
    created (tried, since permission bits do not bind root and /proc refuses anyway)."""
    import os
    import tempfile

    path = Path(path)
    if path.exists():
        if directory and not path.is_dir():
            return f"{path} exists and is not a directory"
        if not directory and path.is_dir():
            return f"{path} is a directory: name a file"
        if not directory and not os.access(path, os.W_OK):
            return f"{path} exists and is not writable"
    where = path if directory and path.is_dir() else path.parent
    while not where.exists() and where != where.parent:
        where = where.parent
    if not where.is_dir():
        return f"{where} is not a directory, so {path} cannot be created"
    try:
        fd, probe = tempfile.mkstemp(dir=where, prefix=".fisherdyn-write-test-")
    except OSError as e:
        return f"cannot create files in {where} ({e.strerror or e})"
    os.close(fd)
    os.unlink(probe)
    return None


def check_outputs(args: argparse.Namespace, parser: argparse.ArgumentParser):
    """Every path a command will write can be written (`parser.error`, exit 2, otherwise):
    checked before any computation, so that a bad path costs nothing."""
    outputs = []  # (option, path, is a directory)
    if args.command == "simulate" and args.out is not None:
        outputs.append(("--out", args.out, False))
    if args.command == "run" and not args.no_figures:
        outputs.append(("--figures-dir", args.figures_dir, True))
    if args.command == "sweep" and not args.dry_run:
        outputs.append(("--out", args.out, True))
        if not args.no_figure:
            from .._sweep import summary_figure_path

            outputs.append(("--out", summary_figure_path(args.out), False))
    for option, path, directory in outputs:
        error = output_path_error(path, directory=directory)
        if error is not None:
            parser.error(f"argument {option}: {error}")


# --------------------------------------------------------------------------- fisherdyn sweep


def _address(text):
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return text


def configure_sweep(p: argparse.ArgumentParser):
    p.epilog = (
        "Exit status: 0: every chunk computed (problems that failed are recorded in the store "
        "by result code and counted in the summary); 2: a bad argument, spec or output "
        "path, or a store made for another spec (checked before computing); 130: "
        "interrupted, the chunks committed so far kept (the same command resumes); 141: the "
        "reader of the output went away."
    )
    p.add_argument("spec", type=existing_file, metavar="SPEC.toml", help="the grid to sweep")
    p.add_argument(
        "--out", type=Path, required=True, metavar="STORE.zarr", help="the Zarr store to fill"
    )
    p.add_argument(
        "--chunk-size",
        type=_positive_int,
        default=None,
        metavar="N",
        help="problems per chunk, the unit of commit (default 512; a resumed store keeps its own)",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the problem count, the chunks and an estimate from a timed first chunk",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--no-figure", action="store_true", help="no summary figure beside the store")
    dist = p.add_argument_group("several processes (jax.distributed)")
    dist.add_argument(
        "--coordinator",
        type=_address,
        default=None,
        metavar="HOST:PORT",
        help="the address of process 0 (jax.distributed.initialize)",
    )
    dist.add_argument(
        "--num-processes", type=_positive_int, default=None, metavar="P", help="processes P"
    )
    dist.add_argument(
        "--process-id",
        type=_int_at_least(0),
        default=None,
        metavar="I",
        help="this process, 0..P-1: it computes the chunks i with i mod P = I",
    )


def check_sweep(args: argparse.Namespace, parser: argparse.ArgumentParser):
    """The distributed options go together (`parser.error`, exit 2, otherwise)."""
    given = [args.coordinator, args.num_processes, args.process_id]
    if any(v is not None for v in given) and any(v is None for v in given):
        parser.error(
            "argument --coordinator: --coordinator, --num-processes and --process-id go together"
        )
    if args.process_id is not None and args.process_id >= args.num_processes:
        parser.error(
            f"argument --process-id: must be < --num-processes ({args.num_processes}), "
            f"got {args.process_id}"
        )
