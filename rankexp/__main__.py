"""``python -m rankexp [overrides] [-m]`` — the one entrypoint (design.md §1)."""

from __future__ import annotations

from pathlib import Path

import hydra
from omegaconf import DictConfig

from .config import register_configs

CONF_DIR = str(Path(__file__).resolve().parent.parent / "conf")

register_configs()


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")
def main(cfg: DictConfig) -> dict:
    from .app import run

    return run(cfg)


if __name__ == "__main__":
    main()
