"""``python -m rankexp [overrides] [-m]`` — the one entrypoint (design.md §1)."""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from .config import register_configs

CONF_DIR = str(Path(__file__).resolve().parent.parent / "conf")

register_configs()


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")
def main(cfg: DictConfig) -> dict:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from .app import run
    from .config import ConfigError

    try:
        return run(cfg)
    except ConfigError as e:
        if HydraConfig.get().mode == RunMode.MULTIRUN:
            raise  # Hydra records this job as failed and runs the others
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
