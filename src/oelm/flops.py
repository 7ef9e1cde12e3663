"""TEMPORARY placeholder until the FLOP counter lands (branch i-bench)."""


def model_flops_per_token(model, seq_len):
    raise ValueError("placeholder")
