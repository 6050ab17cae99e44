"""The textbook chapter "Why Deeper Is Not Always Better" on plain (and residual) nets
(science.md §5): the mean-field lab's figures, its claims and registry entries."""
