# The two commands a fresh machine needs: `make demo` (the main job) and `make test`.
# Each sets up .venv first (scripts/setup.sh), so nothing else must be installed by hand.
VENV ?= .venv
PY := $(VENV)/bin/python
DEMO_OUT ?= runs/demo-$(shell printf '%s' '$(DEMO_ALGOS)' | sha1sum | cut -c1-8)
# A hard-exploration question: on a 15x15 maze plain PPO never finds the goal in 100k steps.
# The exploration baselines (count, rnd), each seed signal alone, and each on top of the
# count bonus; re-running resumes/skips.
DEMO_ALGOS ?= ppo,ppo+count,ppo+rnd,ppo+calibration,ppo+shaping[mode=potential],ppo+gear,ppo+count+calibration,ppo+count+shaping[mode=potential],ppo+count+gear

.PHONY: setup demo test test-fast lint bench

setup:
	bash scripts/setup.sh all

demo: setup
	$(VENV)/bin/reflectrl compare --env reflectrl/GridWorld-v0 --algos '$(DEMO_ALGOS)' --seeds 5 \
		--total-steps 100000 --set env.size=15 env.layout=maze --out $(DEMO_OUT)

test: setup
	$(PY) -m pytest tests -q

# the development subset: everything but the slow tests (learning, subprocesses, Chromium, TRL)
test-fast: setup
	$(PY) -m pytest tests -q -m "not slow"

lint: setup
	$(VENV)/bin/ruff check src tests examples bench

bench: setup
	$(PY) bench/throughput.py
