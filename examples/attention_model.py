"""A causal multi-head attention block in Equinox with a learnable per-head temperature
and a learnable Abe shape (the attention guide's "Inside an Equinox module").

Run: python examples/attention_model.py
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import fisherdyn as fd


class EntropyAttention(eqx.Module):
    qkv: eqx.nn.Linear
    out: eqx.nn.Linear
    log_T: jax.Array        # one temperature per head
    shape: jax.Array        # lambda = (ln q)^2 >= 0
    heads: int = eqx.field(static=True)

    def __init__(self, dim, heads, *, key):
        k1, k2 = jax.random.split(key)
        self.qkv = eqx.nn.Linear(dim, 3 * dim, key=k1)
        self.out = eqx.nn.Linear(dim, dim, key=k2)
        self.log_T = jnp.full((heads, 1), 0.5 * jnp.log(dim // heads))
        self.shape = jnp.asarray(0.1)
        self.heads = heads

    def __call__(self, x):                       # x: (seq, dim)
        n, dim = x.shape
        q, k, v = jnp.split(jax.vmap(self.qkv)(x), 3, axis=-1)
        split = lambda a: a.reshape(n, self.heads, -1).transpose(1, 0, 2)
        causal = jnp.tril(jnp.ones((n, n), bool))
        entropy = fd.Abe(jnp.exp(jnp.sqrt(self.shape)))
        o = fd.attention(split(q), split(k), split(v), entropy=entropy,
                         T=jnp.exp(self.log_T), mask=causal)
        return jax.vmap(self.out)(o.transpose(1, 0, 2).reshape(n, dim))


model = EntropyAttention(32, 4, key=jax.random.key(0))
x = jax.random.normal(jax.random.key(1), (10, 32))
grads = eqx.filter_grad(lambda m: jnp.sum(m(x) ** 2))(model)
print(model(x).shape, grads.log_T.ravel(), grads.shape)
