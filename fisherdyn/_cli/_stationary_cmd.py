"""`fisherdyn stationary`: scores in, the stationary weights of a family out.

The options are set up here without importing JAX (so that `--help` answers at once); the
command itself calls the public `fisherdyn.stationary`, once, on every row at the same time.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

from . import _options

__all__ = ["configure_stationary", "check_stationary", "stationary_command"]

FORMATS = ("json", "csv", "npy")

EXAMPLES = """\
examples:
  fisherdyn stationary --entropy tsallis:1.5 --scores 1.3,0.2,-0.7,0.9 --T 0.8
  fisherdyn stationary --entropy kaniadakis:0.3 --scores-file examples/score_rows.csv \\
      --out weights.csv
  echo "1,2,3" | fisherdyn stationary --scores-file - --format csv

A scores file holds one problem per row (a single row or column is one problem): .npy
(1-D or 2-D), or text with numbers separated by commas or spaces (.csv, .txt, '-' for
stdin). -inf scores, like masked keys, get weight 0. The weights are written with the
shape of the scores: JSON to stdout unless --out is given; the format follows --format,
else the suffix of --out (.json, .csv, .npy). Bad input exits with status 2; weights that
are not finite or do not sum to 1 are an error (status 1), never written.
"""


# --------------------------------------------------------------------------- argument types


def _read_array(text: str, what: str):
    """A 1-D or 2-D float array from a .npy file, a text file, or stdin ('-')."""
    import numpy as np

    if text != "-" and not Path(text).is_file():
        raise argparse.ArgumentTypeError(f"no such file: {text}")
    try:
        if text != "-" and Path(text).suffix.lower() == ".npy":
            values = np.load(text, allow_pickle=False)
        else:
            content = sys.stdin.read() if text == "-" else Path(text).read_text()
            lines = [ln for ln in content.splitlines() if ln.split("#")[0].strip()]
            if not lines:
                raise argparse.ArgumentTypeError(f"{text} holds no {what}")
            delimiter = "," if "," in content else None
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # numpy's own warnings: the error says it
                values = np.loadtxt(lines, delimiter=delimiter, ndmin=1)
    except argparse.ArgumentTypeError:
        raise
    except Exception as e:  # noqa: BLE001 - unreadable content: say so, in one line
        message = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise argparse.ArgumentTypeError(f"cannot read {text}: {message}") from None
    values = np.asarray(values)
    if values.dtype.kind not in "biuf":
        raise argparse.ArgumentTypeError(
            f"{text} must hold real numbers, got an array of dtype {values.dtype}"
        )
    if values.ndim not in (1, 2) or values.size == 0:
        raise argparse.ArgumentTypeError(
            f"{text} must hold a vector or a matrix (one problem per row), got shape "
            f"{values.shape}"
        )
    return values


def _scores_file(text):
    import numpy as np

    z = _read_array(text, "scores").astype(np.float64)
    bad = np.isnan(z) | (z == np.inf)
    if bad.any():
        where = np.argwhere(bad)[0]
        at = f"row {where[0]}, key {where[1]}" if z.ndim == 2 else f"key {where[0]}"
        raise argparse.ArgumentTypeError(
            f"{text}: scores must be finite or -inf (a dropped key), got {z[tuple(where)]} "
            f"at {at} (counting from 0)"
        )
    return z


def _mask_values(values, source):
    import numpy as np

    if not np.all((values == 0) | (values == 1)):
        raise argparse.ArgumentTypeError(f"{source}: a mask holds 1 (keep) or 0 (drop) only")
    return values.astype(bool)


def _mask_inline(text):
    import numpy as np

    words = {"1": 1.0, "0": 0.0, "true": 1.0, "false": 0.0}
    entries = [e.strip().lower() for e in text.split(",")]
    if not all(e in words for e in entries):
        raise argparse.ArgumentTypeError(
            f"expected comma-separated 1 (keep) and 0 (drop), such as '1,1,0', got {text!r}"
        )
    return np.array([words[e] for e in entries]).astype(bool)


def _mask_file(text):
    return _mask_values(_read_array(text, "mask"), text)


def _format(text):
    if text.lower() not in FORMATS:
        raise argparse.ArgumentTypeError(f"one of {', '.join(FORMATS)}, got {text!r}")
    return text.lower()


# --------------------------------------------------------------------------- the parser


def configure_stationary(p: argparse.ArgumentParser):
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = EXAMPLES
    p.add_argument(
        "--entropy",
        type=_options.entropy_arg,
        default=None,  # Shannon, made after parsing so that a usage error needs no JAX
        help="entropy family and parameters, e.g. shannon, tsallis:2, kaniadakis:0.3, "
        "renyi:2, sharma_mittal:2,1.5, burg, abe:1.5 (default shannon)",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--scores", type=_options.vector_arg, default=None, help="comma-separated scores"
    )
    src.add_argument(
        "--scores-file",
        type=_scores_file,
        default=None,
        metavar="PATH",
        help="scores from a .npy, .csv or .txt file, one problem per row ('-': stdin)",
    )
    p.add_argument(
        "--T",
        type=_options._number("T", positive=True),
        default=1.0,
        help="temperature > 0 (default 1)",
    )
    mask = p.add_mutually_exclusive_group()
    mask.add_argument(
        "--mask",
        type=_mask_inline,
        default=None,
        help="keys to keep, comma-separated 1/0, one per key (the same for every row)",
    )
    mask.add_argument(
        "--mask-file",
        type=_mask_file,
        default=None,
        metavar="PATH",
        help="a mask of 1 (keep) and 0 (drop) with the shape of the scores, or one row",
    )
    p.add_argument(
        "--format",
        type=_format,
        default=None,
        metavar="{json,csv,npy}",
        help="output format (default: from the suffix of --out, else json)",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="PATH",
        help="write the weights to this file (default: stdout; npy needs a file)",
    )


def _output_format(args, parser) -> str:
    suffix = args.out.suffix.lower().lstrip(".") if args.out is not None else ""
    if args.format is not None:
        if suffix in FORMATS and suffix != args.format:
            parser.error(f"argument --format: {args.format} does not match --out {args.out}")
        fmt = args.format
    elif args.out is None:
        fmt = "json"
    elif suffix in FORMATS:
        fmt = suffix
    else:
        parser.error(
            f"argument --out: cannot tell the format of {str(args.out)!r}: end it in .json, "
            ".csv or .npy, or give --format"
        )
    if fmt == "npy" and args.out is None:
        parser.error("argument --format: npy is binary: give --out FILE.npy")
    return fmt


def _check_out(path: Path, parser):
    """The output file can be written: checked before any computation."""
    from ._options import output_path_error

    error = output_path_error(path)
    if error is not None:
        parser.error(f"argument --out: {error}")


def check_stationary(args: argparse.Namespace, parser: argparse.ArgumentParser):
    """The checks that relate several options (`parser.error`, exit 2, on a failure)."""
    import numpy as np

    if args.out is not None:
        _check_out(args.out, parser)
    args.format = _output_format(args, parser)
    z = args.scores_file if args.scores_file is not None else np.asarray(args.scores, float)
    args.scores_array = z
    mask = args.mask if args.mask is not None else args.mask_file
    if mask is not None:
        option = "--mask" if args.mask is not None else "--mask-file"
        if mask.shape not in (z.shape, z.shape[-1:]):
            parser.error(
                f"argument {option}: shape {mask.shape} fits neither the scores "
                f"{z.shape} nor one row ({z.shape[-1]} keys)"
            )
        mask = np.broadcast_to(mask, z.shape)
    args.mask_array = mask


# --------------------------------------------------------------------------- the command


def _rows_off(w, keep):
    """Indices of the rows whose weights are not finite or do not sum to 1 (rows with no
    kept key sum to 0)."""
    import numpy as np

    w2, keep2 = np.atleast_2d(w), np.atleast_2d(keep)
    expected = np.where(keep2.any(-1), 1.0, 0.0)
    # well above the float64 round-off of every family, far below any misplaced mass
    off = ~np.all(np.isfinite(w2), -1) | (np.abs(w2.sum(-1) - expected) > 1e-6)
    return np.flatnonzero(off)


def _write(args, w, label):
    import numpy as np

    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
    if args.format == "npy":
        with open(args.out, "wb") as f:  # a file object: np.save keeps the name given
            np.save(f, w)
        return
    if args.format == "csv":
        text = "\n".join(",".join(f"{v:.17g}" for v in row) for row in np.atleast_2d(w)) + "\n"
    else:
        text = json.dumps(dict(entropy=label, T=args.T, shape=list(w.shape),
                               weights=w.tolist())) + "\n"
    if args.out is None:
        sys.stdout.write(text)
    else:
        args.out.write_text(text)


def stationary_command(args: argparse.Namespace) -> int:
    import jax.numpy as jnp
    import numpy as np

    import fisherdyn as fd

    from ._verify import entropy_label

    entropy = args.entropy if args.entropy is not None else fd.Shannon()
    z = args.scores_array
    keep = np.isfinite(z) if args.mask_array is None else args.mask_array & np.isfinite(z)
    mask = None if args.mask_array is None else jnp.asarray(args.mask_array)
    try:
        w = np.asarray(fd.stationary(entropy, jnp.asarray(z), args.T, mask=mask))
    except ValueError as e:
        print(f"fisherdyn stationary: error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    off = _rows_off(w, keep)
    if off.size:
        rows = ", ".join(map(str, off[:5])) + (", ..." if off.size > 5 else "")
        print(
            f"fisherdyn stationary: error: the weights of {off.size} row(s) ({rows}) are not "
            "finite or do not sum to 1; nothing written",
            file=sys.stderr,
        )
        return 1
    _write(args, w, entropy_label(entropy))
    if args.out is not None:
        print(f"wrote {args.out} ({args.format}, shape {'x'.join(map(str, w.shape))})")
    return 0
