"""He et al.'s (2016) degradation replication with the chapter's measurements (science.md §5,
last item): its figures, tables, claims and registry entry."""
