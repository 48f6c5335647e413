"""hpcdp: data-parallel GPT-2 pre-training on Slurm.

This package is the toolkit (config, render, submit, status, harvest). It never imports torch or
transformers at module level, so the CLI starts fast; train/ is the training side.
"""

from pathlib import Path

__version__ = "0.1.0"

# Where the hpcdp and train packages are (a checkout's root, or site-packages after a wheel):
# what a job's ranks and `python -m train` get as PYTHONPATH.
PROJECT_ROOT = Path(__file__).resolve().parent.parent
# What hpcdp reads besides code: a checkout's templates/, experiments/ and scripts/, or the copy
# a wheel installs inside the package (pyproject.toml's hpcdp.shipped).
DATA_ROOT = (PROJECT_ROOT if (PROJECT_ROOT / "templates" / "base.sbatch.j2").is_file()
             else Path(__file__).resolve().parent / "shipped")
TEMPLATES_DIR = DATA_ROOT / "templates"
EXPERIMENTS_DIR = DATA_ROOT / "experiments"
PROFILES_DIR = EXPERIMENTS_DIR / "profiles"
# The forecast's published figures live beside the experiments but are not experiments.
PUBLISHED_FIGURES = EXPERIMENTS_DIR / "forecast-published.yaml"
PUBLISHED_SERIES = EXPERIMENTS_DIR / "forecast-published-series.yaml"
SCRIPTS_DIR = DATA_ROOT / "scripts"
