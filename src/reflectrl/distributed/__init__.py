"""One run beyond one process: the IMPALA actor-learner on Ray (`--algo impala`).

actor.py   an actor: its vector envs, a local policy copy, fixed-length unrolls
pool.py    the learner's actors: in-process (inline) or Ray actor processes; weights through
           Ray's object store; asynchronous or synchronous collection; replacing dead actors
impala.py  the learner: V-trace (reflectrl.estimators.vtrace), the signals, checkpoints
"""
