#!/usr/bin/env bash
# The test command (README, .ci/run): set up, then every check that runs without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
python3 -m ruff check packages tests ci bench && python3 -m ruff format --check packages tests ci bench
python3 ci/check_pixi.py
python3 ci/render_recipes.py | tail -1
python3 -m pytest tests -q "$@"
