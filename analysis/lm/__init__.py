"""Language models: GPT-2's FFN branch along the residual stream (the study, Figure 12)."""
