"""The rest of the study (the study, §4): Figures 10, 11, 13–15, 17 and Tables 2, 3."""
