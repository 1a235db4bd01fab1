# The two commands a fresh machine needs: `make demo` (the main job) and `make test`.
# Each sets up .venv first (scripts/setup.sh), so nothing else must be installed by hand.
VENV ?= .venv
PY := $(VENV)/bin/python
DEMO_OUT ?= runs/demo-$(shell date +%Y%m%d-%H%M%S)

.PHONY: setup demo test bench

setup:
	bash scripts/setup.sh all

demo: setup
	$(VENV)/bin/reflectrl train --algo ppo --env reflectrl/GridWorld-v0 --seed 1 --total-steps 100000 --out $(DEMO_OUT)
	$(VENV)/bin/reflectrl eval $(DEMO_OUT) --episodes 20 --deterministic

test: setup
	$(PY) -m pytest tests -q

bench: setup
	$(PY) bench/throughput.py
