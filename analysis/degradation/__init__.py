"""He et al. (2016) degradation replication, with the chapter's measurements."""
