"""Language models (science.md §4 fig12): GPT-2's FFN branch along the residual stream — its
figure, claims and registry entry."""
