"""rankexp's Hydra plugins (Hydra instantiates plugins from the ``hydra_plugins`` namespace).

* :class:`~hydra_plugins.rankexp_plugins.sweeper.RankexpSweeper` (``hydra/sweeper=rankexp``,
  the default): a union of grids, checked as a whole before any job, with the sweep's parent
  run and exit status.
* :class:`~hydra_plugins.rankexp_plugins.contour.ContourSweeper` (``hydra/sweeper=contour``):
  the same sweeper in rounds, narrowing brackets until it has found a level set or boundary
  of a metric along one axis.
"""
