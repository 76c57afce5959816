"""Compilation settings shared by the modules.

Programs that run once or a handful of times per call (initialization, evaluation, path
extraction, fit summaries, short training runs) spend far longer in XLA's optimizing
compiler than in execution on a CPU. They are compiled at XLA backend optimization level 0:
the same program and results to round-off, about half the compile time, slower execution
(measured: a looped-transformer training step 7.8 -> 14 ms, its compilation 6.5 -> 3.2 s).
Hot loops (operators, dynamics, the fit program) keep the default level.
"""

RUN_ONCE = dict(compiler_options={"xla_backend_optimization_level": 0})
"""`jax.jit` / `eqx.filter_jit` keyword arguments for programs that run a few times."""
