"""The study's core figures and tables: Figures 1–8 and 16, Tables 1, 4–6."""
