"""The study's core figures and tables (science.md §3): Figures 1–8 and 16, Tables 1, 4–6 —
their commands, claims and registry entries."""
