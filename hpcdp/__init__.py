"""hpcdp: data-parallel GPT-2 pre-training on Slurm.

This package is the toolkit (config, render, submit, status, harvest). It never imports torch or
transformers at module level, so the CLI starts fast; train/ is the training side.
"""

from pathlib import Path

__version__ = "0.1.0"

# The source tree: templates/, experiments/ and scripts/ live beside the package.
PROJECT_ROOT = Path(__file__).resolve().parent.parent
TEMPLATES_DIR = PROJECT_ROOT / "templates"
EXPERIMENTS_DIR = PROJECT_ROOT / "experiments"
PROFILES_DIR = EXPERIMENTS_DIR / "profiles"
