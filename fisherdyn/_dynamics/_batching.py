"""Solving a batch of problems in one compiled call.

Leading axes of the scores (and of any per-problem argument) are batch axes. They are
broadcast, flattened to one axis and vmapped in blocks (`lax.map` with `batch_size`), so that
each block's state stays in cache and each block stops at its own slowest member instead of
the whole batch's. A batch sharded over devices (`jax.sharding`) is vmapped whole instead:
XLA partitions the vmapped loop, each device solving its own shard.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from .._custom_types import PyTree
from ._problem import Problem
from ._system import FisherSystem

__all__ = ["run"]

# Problems per vmapped block. On the CPU small enough for a block's state to stay in cache;
# an accelerator needs many problems in flight at once to fill it, so it takes large blocks
# (each block still stops at its own slowest member).
_CPU_BLOCK = 256
_ACCELERATOR_BLOCK = 1 << 16
# Problems per block integrated as one system (`block` of `run`): on the CPU a smaller block
# keeps the stages of a step in cache, and it stops at its own slowest member sooner. With
# more than one core an explicit step's kernels on a larger block split across the cores at
# the same CPU time (an implicit step's Newton solves wait for the block's slowest member).
_CPU_SYSTEM_BLOCK = 64
_CPU_SYSTEM_BLOCK_MULTICORE = 256


def _cores() -> int:
    """The cores this process may run on (XLA:CPU sizes its thread pool by them)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _block_size(system: bool = False, explicit: bool = False) -> int:
    """Problems per vmapped block (`system`: per block integrated as one system, by an
    `explicit` solver or not) on the default backend (read when the batch is traced)."""
    if jax.default_backend() != "cpu":
        return _ACCELERATOR_BLOCK
    if not system:
        return _CPU_BLOCK
    return _CPU_SYSTEM_BLOCK_MULTICORE if explicit and _cores() > 1 else _CPU_SYSTEM_BLOCK


def _batch_shape(problem: Problem, extra: tuple, extra_dims: tuple) -> tuple[int, ...]:
    """The problem's batch shape, widened by any batch axes of the extra arguments."""
    shapes = [problem.batch_shape]
    for e, d in zip(extra, extra_dims):
        if e is not None:
            shapes.append(jnp.shape(e)[: jnp.ndim(e) - d])
    return tuple(jnp.broadcast_shapes(*shapes))


def _broadcast_problem(problem: Problem, extra: tuple, extra_dims: tuple, shape):
    """Broadcast every per-problem array to the batch shape and flatten it to one axis."""
    size = int(np.prod(shape)) if shape else 1
    s = problem.system

    def per_problem(x, event_dims):
        x = jnp.asarray(x)
        tail = x.shape[x.ndim - event_dims :] if event_dims else ()
        x = jnp.broadcast_to(x, shape + tail)
        return x.reshape((size,) + tail)

    entropy = jtu.tree_map(lambda leaf: per_problem(leaf, 0), s.entropy)
    system = FisherSystem(
        entropy,
        per_problem(s.scores, 1),
        per_problem(s.T, 0),
        per_problem(s.mass, 0),
        per_problem(s.damping, 0),
        None if s.mask is None else per_problem(s.mask, 1),
    )
    rho0 = per_problem(problem.rho0, 1)
    v0 = None if problem.velocity0 is None else per_problem(problem.velocity0, 1)
    extra = tuple(None if e is None else per_problem(e, d) for e, d in zip(extra, extra_dims))
    return system, rho0, v0, extra


def _unflatten(tree, shape):
    return jtu.tree_map(lambda x: x.reshape(shape + x.shape[1:]), tree)


def _explicit_batch_axis(tree):
    """(mesh, axis) splitting the batch (leading) axis of an explicitly sharded input."""
    for leaf in jtu.tree_leaves(tree):
        sharding = jax.typeof(leaf).sharding
        spec = getattr(sharding, "spec", None)
        if spec is not None and len(spec) and spec[0] is not None:
            return sharding.mesh, spec[0]
    return None


def _batch_is_sharded(tree) -> bool:
    """Whether the batch is split over several devices (`jax.sharding`).

    True for an input whose type names a mesh axis on its batch axis (explicit sharding), or
    a concrete array that is not fully replicated. Automatic sharding inside an outer jit is
    invisible here, and XLA partitions the blocked loop as it sees fit.
    """
    if _explicit_batch_axis(tree) is not None:
        return True
    return any(
        isinstance(leaf, jax.Array)
        and not isinstance(leaf, jax.core.Tracer)
        and not leaf.sharding.is_fully_replicated
        for leaf in jtu.tree_leaves(tree)
    )


@eqx.filter_jit
def _jit_single(single, system, rho0, v0, extra, static):
    return single(system, rho0, v0, extra, static)


def _vmap_explicitly_sharded(fn, args, mesh, axis):
    """vmap `fn` over `args` split along the mesh axis `axis`.

    Diffrax's internals are written for automatic sharding, so the solve runs with the mesh
    axis switched to automatic (`auto_axes`), its inputs and outputs split along the batch.
    """

    def split(x):
        return NamedSharding(mesh, PartitionSpec(axis, *([None] * (jnp.ndim(x) - 1))))

    args = jtu.tree_map(lambda x: jax.sharding.reshard(x, split(x)), args)
    plain = jtu.tree_map(lambda x: jax.ShapeDtypeStruct(jnp.shape(x), x.dtype), args)
    out = eqx.filter_eval_shape(jax.vmap(fn), plain)
    return jax.sharding.auto_axes(jax.vmap(fn), axes=axis, out_sharding=jtu.tree_map(split, out))(
        args
    )


def _map_blocks(fn_block, args, size, block):
    """`fn_block` on consecutive blocks of `block` problems (the last one shorter)."""
    full = size // block * block
    outs = []
    if full:
        head = jtu.tree_map(lambda x: x[:full].reshape((-1, block) + x.shape[1:]), args)
        out = jax.lax.map(fn_block, head)
        outs.append(jtu.tree_map(lambda x: x.reshape((full,) + x.shape[2:]), out))
    if full < size:
        outs.append(fn_block(jtu.tree_map(lambda x: x[full:], args)))
    if len(outs) == 1:
        return outs[0]
    return jtu.tree_map(lambda *xs: jnp.concatenate(xs), *outs)


@eqx.filter_jit
def _jit_batch(single, system, rho0, v0, extra, static, sharded=False, block_fn=None):
    fn = lambda args: single(*args, static)  # noqa: E731
    size = rho0.shape[0]
    args = (system, rho0, v0, extra)
    if sharded:
        found = _explicit_batch_axis(args)
        if found is not None:
            return _vmap_explicitly_sharded(fn, args, *found)
    if not sharded:
        # the barrier hides that per-problem copies of a shared end time or save times are
        # broadcasts, on which XLA's algebraic simplifier loops inside a caller's jit (a page
        # of warnings on stderr per compilation); on the extras only, so results stay the same
        args = (*args[:3], jax.lax.optimization_barrier(extra))
    block = _block_size()
    if block_fn is not None and not sharded:
        explicit = isinstance(static.solver_of_block, diffrax.AbstractERK)
        return _map_blocks(lambda a: block_fn(*a, static), args, size,
                           _block_size(system=True, explicit=explicit))
    if size <= block or sharded:
        return jax.vmap(fn)(args)
    return jax.lax.map(fn, args, batch_size=block)


def run(
    single: Callable,
    problem: Problem,
    extra: tuple,
    extra_dims: tuple[int, ...],
    static,
    block: Callable | None = None,
) -> PyTree:
    """Solve one problem with `single(system, rho0, velocity0, extra, static)`, or vmap it
    over the flattened batch and restore the batch shape.

    **Arguments:**
    - `single`: the solve of one problem (a module-level function: it is a static argument
      of the compiled call).
    - `problem`: the checked problem.
    - `extra`: further per-problem arguments (None entries pass through).
    - `extra_dims`: the number of trailing (non-batch) axes of each of `extra` (0: a
      per-problem scalar, 1: a grid of times).
    - `static`: hashable static arguments of `single`.
    - `block`: optionally, the solve of a block of problems at once (same signature, every
      argument with a leading batch axis), used instead of vmapping `single` over a block
      (not for a batch sharded over devices).

    **Returns:** the output of `single`, with the batch shape on its leading axes.
    """
    shape = _batch_shape(problem, extra, extra_dims)
    if shape == ():
        return _jit_single(single, problem.system, problem.rho0, problem.velocity0, extra, static)
    sharded = _batch_is_sharded((problem, extra))
    system, rho0, v0, extra = _broadcast_problem(problem, extra, extra_dims, shape)
    out = _jit_batch(single, system, rho0, v0, extra, static, sharded, block)
    return _unflatten(out, shape)
