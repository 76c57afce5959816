from ._normalizer import attention as attention, attention_weights as attention_weights
from ._losses import (
    entmax as entmax,
    entmax15 as entmax15,
    entmax15_loss as entmax15_loss,
    entmax_loss as entmax_loss,
    fenchel_young_loss as fenchel_young_loss,
    sparsemax as sparsemax,
    sparsemax_loss as sparsemax_loss,
)
from ._flax import flax_attention_fn as flax_attention_fn
from ._equinox import MultiheadAttention as MultiheadAttention
from ._carried import (
    AbstractCarriedLoop as AbstractCarriedLoop,
    FisherLoop as FisherLoop,
    LinearScoreLoop as LinearScoreLoop,
)
