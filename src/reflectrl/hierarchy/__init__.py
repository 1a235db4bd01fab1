"""Two-level agents: a high-level policy proposes sub-goals, a goal-conditioned low level reaches them
(seed 002 section 6.1). See hppo.py."""
