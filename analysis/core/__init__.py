"""The analysis core: the runs loader (:mod:`.runs`, :mod:`.select`, :mod:`.seeds`), the house
style (:mod:`.style`, :mod:`.tables`), claims (:mod:`.claims`), the experiment registry and the
command runner (:mod:`.registry`, :mod:`.runner`) and the report (:mod:`.report`).  It imports
no experiment module: the registry finds them when first asked."""
