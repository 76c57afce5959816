"""`fisherdyn sweep`: a TOML grid of relaxations into a resumable Zarr store."""

from __future__ import annotations

import argparse
import sys

__all__ = ["sweep_command"]


def sweep_command(args: argparse.Namespace) -> int:
    import jax

    from .._sweep import SpecError, StoreMismatch, sweep

    if args.coordinator is not None:
        # before any computation: every process then sees the others' devices
        jax.distributed.initialize(
            coordinator_address=args.coordinator,
            num_processes=args.num_processes,
            process_id=args.process_id,
        )
    try:
        out = sweep(
            args.spec,
            args.out,
            chunk_size=args.chunk_size,
            progress=not args.no_progress,
            dry_run=args.dry_run,
            figure=not args.no_figure,
        )
    except (SpecError, StoreMismatch) as e:
        print(f"fisherdyn sweep: error: {e}", file=sys.stderr)
        return 2
    if args.dry_run:
        print(out)
    elif out is not None:
        print(out.attrs["summary"])
        if not args.no_figure and "not computed" not in out.attrs["summary"]:
            from .._sweep import summary_figure_path

            print(f"wrote {args.out} and {summary_figure_path(args.out)}")
        else:
            print(f"wrote {args.out}")
    if args.coordinator is not None:
        jax.distributed.shutdown()
    return 0
