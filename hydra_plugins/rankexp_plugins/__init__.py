"""rankexp's Hydra plugins (Hydra only instantiates plugins from the ``hydra_plugins`` namespace).

* :class:`~hydra_plugins.rankexp_plugins.sweeper.RankexpSweeper` (``hydra/sweeper=rankexp``,
  the default in conf/config.yaml): Hydra's basic sweeper that checks the whole sweep before
  any job starts, composes each job once, and owns the sweep's parent run and exit status.
* :class:`~hydra_plugins.rankexp_plugins.contour.ContourSweeper` (``hydra/sweeper=contour``):
  the same sweeper in rounds, narrowing brackets until it has found a level set or boundary
  of a metric along one axis (its math: :mod:`rankexp.levelset`).
* :class:`~hydra_plugins.rankexp_plugins.loader.TemplateConfigLoader`: the compose-once loader.
* :class:`~hydra_plugins.rankexp_plugins.slurm.RankexpSlurmLauncher` (``hydra/launcher=slurm``):
  the submitit Slurm launcher, waiting for every job and cancelling them on interrupt; its
  :func:`~hydra_plugins.rankexp_plugins.slurm.check_cluster` asks the cluster first.
* :class:`~hydra_plugins.rankexp_plugins.joblib_local.RankexpJoblibLauncher`
  (``hydra/launcher=local``): the joblib launcher, surviving a lost worker.
* :mod:`~hydra_plugins.rankexp_plugins.backports`: Hydra's fix of its copied ConfigStore and
  the group listing once per command line (installed here: Hydra's plugin scan imports this
  package in every Hydra process).
"""

from . import backports

backports.install()
