"""Compile options shared by the study's programs."""

RUN_ONCE = dict(compiler_options={"xla_backend_optimization_level": 0})
"""`jax.jit` / `eqx.filter_jit` keyword arguments for programs that run once or a few times
(initialization, evaluation, short training runs, one head's fit): on a CPU, XLA's optimizing
compiler takes far longer than such a program runs, and level 0 gives the same results to
round-off."""
