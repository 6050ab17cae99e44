"""The rest of the study (science.md §4): Figures 10, 11, 13–15, 17 and Tables 2, 3 — their
commands, claims and registry entries (Figures 11/13/17 reuse the study's commands)."""
