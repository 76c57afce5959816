"""Dot-product attention with other entropy families as the normalizer, and its
gradient (the README's "Attention").

Run: python examples/attention.py
"""

import jax
import fisherdyn as fd

kq, kk, kv = jax.random.split(jax.random.key(0), 3)
q = jax.random.normal(kq, (2, 4, 10, 16))   # (batch, heads, queries, d_k)
k = jax.random.normal(kk, (2, 4, 12, 16))
v = jax.random.normal(kv, (2, 4, 12, 16))

out = fd.attention(q, k, v, entropy=fd.Tsallis(1.5))   # T defaults to sqrt(d_k)
w = fd.attention_weights(q, k, entropy=fd.Kaniadakis(0.3))
print(out.shape, w.shape, float(w.sum(-1).min()))

loss = lambda q: fd.attention(q, k, v, entropy=fd.Abe(1.5)).sum()
print(jax.grad(loss)(q).shape)                          # exact gradients
