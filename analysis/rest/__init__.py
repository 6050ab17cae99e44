"""The rest of the study: Figures 10, 11, 13–15, 17 and Tables 2, 3."""
