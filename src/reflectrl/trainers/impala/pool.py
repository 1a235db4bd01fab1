"""The learner's actors: where they run and how their unrolls reach it.

`InlinePool` (actors=inline) steps its actors in the learner's process, one after another:
no Ray, deterministic, for tests and machines without Ray. `RayPool` (actors=ray) runs each
actor as a Ray actor process (`ray.remote(Actor)`) on a local Ray instance or a cluster.

Weights travel through Ray's object store: the learner `ray.put`s its flat parameters once
per update and every unroll call carries that reference, so an actor picks up the newest
weights when it starts its next unroll.

* Asynchronous (the default, IMPALA): every actor always has one unroll in flight. When one
  returns it is queued for the learner and the actor is sent straight back out with the
  newest weights, so acting and learning overlap and a trajectory may come from a policy some
  updates old (its `policy_lag`, which V-trace corrects for).
* Synchronous (`synchronous=true`): the learner asks for exactly the unrolls one batch needs,
  all with its current weights, and takes them in slot order: no lag, and the run is
  deterministic (each slot's trajectories depend only on the weights it is given).

Faults: an unroll either arrives whole or not at all. When a call fails because its actor
died (RayActorError: the process was killed, its node lost), the actor is replaced by a new
one on a new slot (new seeds, fresh episodes), the lost unroll is asked of the replacement,
and `actor_restarts` counts it; after `max_actor_failures` deaths the run stops with one line.
"""

from __future__ import annotations

import os
import warnings
from collections import deque

import numpy as np

from reflectrl.errors import UserError
from reflectrl.trainers.impala.actor import Actor, Unroll


class InlinePool:
    def __init__(self, config: dict, num_actors: int, first_slot: int = 0):
        self.slots = list(range(first_slot, first_slot + num_actors))
        self.actors = [Actor(config, slot) for slot in self.slots]
        self.next_slot = first_slot + num_actors
        self.restarts = 0

    def collect(self, weights: np.ndarray, version: int, unrolls: int) -> list[Unroll]:
        """`unrolls` unrolls with these weights, round robin over the actors in slot order."""
        return [self.actors[k % len(self.actors)].unroll(weights, version) for k in range(unrolls)]

    def states(self) -> list[dict]:
        return [a.get_state() for a in self.actors]

    def load_states(self, states: list[dict]) -> None:
        for actor, state in zip(self.actors, states):
            actor.set_state(state)

    def close(self) -> None:
        for a in self.actors:
            a.close()


LOCAL = "local"  # --ray-address local: start a local Ray instance (overrides a resumed run's saved address)
PROBE_SECONDS = 3.0


def unreachable(address: str, why: str) -> str:
    return (f"--ray-address {address}: cannot reach a Ray cluster there ({why}); start one with `ray start --head`, "
            f"or for a local instance leave --ray-address out (resuming: --resume DIR --ray-address {LOCAL})")


def check_reachable(address: str | None) -> None:
    """Refuse in seconds, before Ray's client logs a page of retries, an address where nothing
    listens. 'auto' and a local instance (None) are left to Ray."""
    import socket

    if address is None or address == "auto":
        return
    hostport = address.split("://", 1)[-1].rstrip("/")
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise UserError(f"--ray-address {address}: give HOST:PORT (or ray://HOST:PORT, auto, {LOCAL})")
    try:
        with socket.create_connection((host, int(port)), timeout=PROBE_SECONDS):
            pass
    except OSError as err:
        raise UserError(unreachable(address, err.strerror or type(err).__name__)) from None


class RayPool:
    def __init__(self, config: dict, num_actors: int, *, synchronous: bool, address: str | None,
                 actor_cpus: float, max_failures: int, first_slot: int = 0):
        try:
            import ray
        except ImportError:
            from reflectrl.trainers.impala.config import NEEDS_RAY

            raise UserError(NEEDS_RAY) from None
        self.ray = ray
        self.reaper = None
        self.started_here = not ray.is_initialized()
        if address == LOCAL:  # a resumed run whose saved cluster is gone: start a local instance instead
            address = None
        else:
            address = address or os.environ.get("RAY_ADDRESS") or None  # as `ray.init()` itself reads it
        if self.started_here:
            check_reachable(address)
            if address is None:  # a local instance: its agents end with this process (distributed/reaper.py)
                from reflectrl.distributed.reaper import start_reaper

                self.reaper = start_reaper()
            try:
                # a local instance offers at least one CPU per actor: on a small machine they time-share
                ray.init(address=address, num_cpus=None if address else max(os.cpu_count() or 1,
                                                                            int(num_actors * actor_cpus + 0.999)),
                         include_dashboard=False, log_to_driver=False, logging_level="ERROR",
                         configure_logging=True)
            except ConnectionError as err:
                raise UserError(unreachable(address, str(err).splitlines()[0] if str(err) else "no answer")) from None
        self.config, self.synchronous = config, synchronous
        self.remote_actor = ray.remote(num_cpus=actor_cpus, max_restarts=0)(Actor)
        self.max_failures, self.restarts = max_failures, 0
        self.slots = list(range(first_slot, first_slot + num_actors))
        self.next_slot = first_slot + num_actors
        self.actors = [self.remote_actor.remote(config, slot) for slot in self.slots]
        self.in_flight: dict = {}   # ObjectRef -> actor index (asynchronous mode)
        self.ready: deque[Unroll] = deque()  # unrolls that arrived before the learner asked for them
        self.pids()  # wait until every actor process is up: its start-up is not part of the time estimate

    # ------------------------------------------------------------------ faults

    def _replace(self, index: int, err: Exception) -> None:
        self.restarts += 1
        if self.restarts > self.max_failures:
            raise UserError(f"{self.restarts} actor deaths (max_actor_failures={self.max_failures}); the last: "
                            f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}; the learner's "
                            "last checkpoint is kept: fix the cause, then --resume")
        self.ray.kill(self.actors[index], no_restart=True)
        old, self.slots[index] = self.slots[index], self.next_slot
        self.next_slot += 1
        self.actors[index] = self.remote_actor.remote(self.config, self.slots[index])
        warnings.warn(f"IMPALA actor slot {old} died ({type(err).__name__}); replaced by slot {self.slots[index]} "
                      f"({self.restarts} of max_actor_failures={self.max_failures})")

    def _get(self, ref, index: int, slot: int, weights, version: int) -> Unroll:
        """The unroll behind `ref` (asked of slot `slot` at actor index `index`); if its actor
        died, the same unroll from its replacement (replaced once, however many calls it lost)."""
        while True:
            try:
                return self.ray.get(ref)
            except self.ray.exceptions.RayActorError as err:
                if self.slots[index] == slot:
                    self._replace(index, err)
                slot = self.slots[index]
                ref = self.actors[index].unroll.remote(weights, version)

    # ------------------------------------------------------------------ collection

    def collect(self, weights: np.ndarray, version: int, unrolls: int) -> list[Unroll]:
        ref = self.ray.put(np.asarray(weights))
        if self.synchronous:
            calls = [(i, self.slots[i], self.actors[i].unroll.remote(ref, version))
                     for i in (k % len(self.actors) for k in range(unrolls))]
            return [self._get(r, i, slot, ref, version) for i, slot, r in calls]
        for i, actor in enumerate(self.actors):  # every actor busy
            if i not in self.in_flight.values():
                self.in_flight[actor.unroll.remote(ref, version)] = i
        while len(self.ready) < unrolls:
            done, _ = self.ray.wait(list(self.in_flight), num_returns=1)
            for r in done:
                i = self.in_flight.pop(r)
                try:
                    self.ready.append(self.ray.get(r))
                except self.ray.exceptions.RayActorError as err:
                    self._replace(i, err)  # the lost unroll is simply not in any batch
                self.in_flight[self.actors[i].unroll.remote(ref, version)] = i
        return [self.ready.popleft() for _ in range(unrolls)]

    def pids(self) -> list[int]:
        return self.ray.get([a.pid.remote() for a in self.actors])

    def states(self) -> list[dict]:
        return self.ray.get([a.get_state.remote() for a in self.actors])

    def load_states(self, states: list[dict]) -> None:
        self.ray.get([a.set_state.remote(s) for a, s in zip(self.actors, states)])

    def close(self) -> None:
        for a in self.actors:
            try:
                self.ray.kill(a, no_restart=True)
            except Exception:  # already gone
                pass
        self.actors, self.in_flight = [], {}
        if self.started_here and self.ray.is_initialized():
            self.ray.shutdown()
        if self.reaper is not None:
            from reflectrl.distributed.reaper import stop_reaper

            stop_reaper(self.reaper)
            self.reaper = None
