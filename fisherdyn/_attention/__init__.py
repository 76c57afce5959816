from ._normalizer import attention as attention, attention_weights as attention_weights
