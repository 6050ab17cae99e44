"""The analysis core: runs (:mod:`.runs`, :mod:`.select`), style and tables (:mod:`.style`),
claims, the registry, the runner and the report.  It imports no experiment module."""
