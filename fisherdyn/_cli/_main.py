"""The `fisherdyn` command (also `python -m fisherdyn`).

- `fisherdyn run`: the verification run behind `make run` (the operator table, then every
  family relaxed in three damping regimes and the overdamped flow, and two figures).
- `fisherdyn simulate`: one trajectory, summarized as text or JSON, optionally plotted or
  saved whole (`--save traj.nc|.npz`).
- `fisherdyn sweep`: a TOML grid of relaxations into a resumable Zarr store.
- `fisherdyn stationary`: scores in, the stationary weights of a family out (JSON/CSV/NPY).

Every command keeps JAX's compiled programs in a persistent cache, and `simulate` its traced
program too (`--no-compilation-cache` or `FISHERDYN_NO_COMPILATION_CACHE=1` to switch them
off).

The parser is plain argparse and imports no JAX: a subcommand's module is imported after
the arguments are parsed, so `--help`, `--version` and usage errors answer at once. Every bad
argument exits with status 2 and one line naming the argument.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

from .._optional import MissingExtra
from . import _extras, _options, _stationary_cmd

__all__ = ["main", "build_parser"]

_COMMANDS = {
    "run": (
        "verify the dynamics: relax every family in three damping regimes and the overdamped "
        "flow, compare with the stationary operators, write figures",
        _options.configure_run,
    ),
    "simulate": (
        "integrate one trajectory of the damped Fisher-Lagrangian dynamics",
        _options.configure_simulate,
    ),
    "sweep": (
        "relax every problem of a TOML grid into a resumable Zarr store",
        _options.configure_sweep,
    ),
    "stationary": (
        "the stationary weights of a family for given scores (JSON, CSV or NPY)",
        _stationary_cmd.configure_stationary,
    ),
}


class _Parser(argparse.ArgumentParser):
    """argparse, with errors as one line: `fisherdyn simulate: error: argument --T: ...`."""

    def error(self, message):
        message = message.rstrip().rstrip(".")  # a message may end in a sentence's period
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


class _Version(argparse.Action):
    """`--version`, read from the installed metadata only when asked for."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        import importlib.metadata

        try:
            version = importlib.metadata.version("fisherdyn")
        except importlib.metadata.PackageNotFoundError:  # a source tree on the path
            version = "unknown (not installed)"
        print(f"fisherdyn {version}")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="fisherdyn",
        description="Entropy-generated attention: stationary operators and their damped "
        "Fisher-Lagrangian dynamics.",
    )
    parser.add_argument("--version", action=_Version, help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name, (help_, configure) in _COMMANDS.items():
        p = sub.add_parser(name, help=help_, description=help_)
        configure(p)
        p.add_argument(
            "--no-compilation-cache",
            action="store_true",
            help="do not keep compiled programs in $FISHERDYN_CACHE/jax, nor simulate's traced "
            "program in $FISHERDYN_CACHE/exported (default: the user cache directory)",
        )
        p.set_defaults(_parser=p)
    return parser


_VECTOR_OPTIONS = ("--scores", "--rho0")


def _glue_negative_vectors(argv):
    """`--scores -0.5,1` would read as an option to argparse: glue it to `--scores=-0.5,1`."""
    out, i = [], 0
    while i < len(argv):
        a = argv[i]
        if a in _VECTOR_OPTIONS and i + 1 < len(argv) and argv[i + 1].startswith("-"):
            try:
                float(argv[i + 1].split(",")[0])  # a number, not an option: the type checks it
            except ValueError:
                out.append(a)
                i += 1
                continue
            out.append(f"{a}={argv[i + 1]}")
            i += 2
            continue
        out.append(a)
        i += 1
    return out


def main(argv=None) -> int:
    """Parse `argv` (default `sys.argv[1:]`), run the subcommand, return its exit status:
    that of the subcommand; 2 for a usage error or a missing optional package (one line
    naming the extra to install); 130 after Ctrl-C; 141 when the reader of the output has
    gone (`fisherdyn simulate --json | head`), as for a process ended by SIGPIPE."""
    program = argv is None  # the `fisherdyn` command itself, not a caller in Python
    argv = sys.argv[1:] if argv is None else list(argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    resume = " (the committed chunks are kept: the same command resumes)"
    interrupted = (f"fisherdyn{' ' + command if command in _COMMANDS else ''}: interrupted"
                   f"{resume if command == 'sweep' else ''}")
    if program and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, lambda signum, frame: _exit_interrupted(interrupted))
    try:
        code = _dispatch(argv)
        sys.stdout.flush()  # a closed pipe shows here, not at exit
        return code
    except MissingExtra as e:  # an optional package: what to install, not a traceback
        print(f"fisherdyn{' ' + command if command in _COMMANDS else ''}: error: {e}",
              file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # a caller's main([...]) keeps Python's Ctrl-C
        print(interrupted, file=sys.stderr)
        return 130
    except BrokenPipeError:
        if not _stdout_closed():
            raise
        # the Python docs' recipe: nothing more can reach the reader, and the interpreter's
        # own flush at exit must not fail again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


def _exit_interrupted(message: str):
    """Ctrl-C in the command: end the worker processes, say so, exit 130 at once. A
    KeyboardInterrupt would not do: raised inside a garbage-collector callback it is
    ignored, and JAX's threads can crash the interpreter's teardown after it. Nothing is
    lost: a sweep's chunks are committed atomically and resume."""
    if "multiprocessing" in sys.modules:
        import multiprocessing
        import multiprocessing.util

        children = multiprocessing.active_children()
        for child in children:
            child.terminate()
        for child in children:
            child.join(timeout=5)
        # what multiprocessing runs at a normal exit: its finalizers release the pool's
        # semaphores, which the resource tracker would otherwise report as leaked
        getattr(multiprocessing.util, "_exit_function", lambda: None)()
    try:
        sys.stdout.flush()
    except (OSError, ValueError):  # a closed pipe: nothing more to say there
        pass
    print(message, file=sys.stderr, flush=True)
    os._exit(130)


def _stdout_closed() -> bool:
    """Whether standard output is a pipe whose reader has gone (another broken pipe, such
    as one to a worker process, is a failure to report)."""
    import select

    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return False
    if not hasattr(select, "poll"):  # Windows: no way to ask; standard output is likeliest
        return True
    poll = select.poll()
    poll.register(fd, select.POLLOUT)
    return any(event & select.POLLERR for _, event in poll.poll(0))


def _dispatch(argv) -> int:
    if next((a for a in argv if not a.startswith("-")), None) in ("simulate", "stationary"):
        # as for `sweep` below: the input is checked by the parser, simulate's solver
        # failures come back as result codes and stationary refuses non-finite weights, so
        # the runtime checks can be NaN and the program cacheable. Set before parsing, whose
        # entropy argument imports equinox; a process that has imported it already (a
        # caller of `main`) keeps its setting.
        if "equinox" not in sys.modules:
            os.environ.setdefault("EQX_ON_ERROR", "nan")
    if next((a for a in argv if not a.startswith("-")), None) == "run" and (
        "jax" not in sys.modules
    ):
        # `run` compiles over a hundred programs per family and runs each once: XLA's
        # backend optimizations and its CPU fusion emitters cost more compile time (a fifth,
        # then half of the rest) than they save. Read when JAX creates its CPU client, after
        # this (in the worker processes too, which inherit it); a caller's XLA_FLAGS wins.
        flags = os.environ.get("XLA_FLAGS", "")
        for flag in ("xla_backend_optimization_level=0", "xla_cpu_use_fusion_emitters=false"):
            if flag.split("=")[0] not in flags:
                flags = f"{flags} --{flag}".strip()
        os.environ["XLA_FLAGS"] = flags
    args = build_parser().parse_args(_glue_negative_vectors(argv))
    if args.command == "simulate":
        _options.check_simulate(args, args._parser)
    if args.command == "stationary":
        _stationary_cmd.check_stationary(args, args._parser)
    if args.command == "sweep":
        _options.check_sweep(args, args._parser)
    _options.check_outputs(args, args._parser)
    _extras.check_extras(args)
    if args.command == "sweep":
        # Equinox's runtime checks as NaN instead of a host callback, which JAX never
        # writes to the persistent cache; a sweep records failures by result code anyway.
        # Read when equinox is first imported, which parsing `sweep` has not done.
        os.environ.setdefault("EQX_ON_ERROR", "nan")
    _options.enable_x64()
    if not args.no_compilation_cache:
        from .._sweep import enable_compilation_cache

        enable_compilation_cache()
    if args.command == "sweep":
        from ._sweep import sweep_command

        return int(sweep_command(args) or 0)
    if args.command == "run":
        from ._run import run_command

        return int(run_command(args) or 0)
    if args.command == "stationary":
        return int(_stationary_cmd.stationary_command(args) or 0)
    from ._simulate import simulate_command

    return int(simulate_command(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
