"""The env ids of the JAX backend (reflectrl/jaxrl/envs.py builds them): FAMILY:NAME, checked
without importing JAX."""

from __future__ import annotations

from reflectrl.errors import UserError

# reflectrl: the built-in maze, reflectrl:GridWorld-v0
FAMILIES = ("gymnax", "navix", "xminigrid", "craftax", "reflectrl")


def is_jax_env(env_id: str) -> bool:
    return ":" in env_id and env_id.split(":", 1)[0] in FAMILIES


def check_jax_env_id(env_id: str, backend: str) -> None:
    """A JAX env id needs backend=jax, and backend=jax a JAX env id."""
    if is_jax_env(env_id) and backend != "jax":
        raise UserError(f"--env {env_id} is a JAX env: add --set backend=jax (pip install 'reflectrl[jax]')")
    if backend == "jax" and not is_jax_env(env_id):
        raise UserError(f"--env {env_id}: backend=jax takes {', '.join(f + ':<id>' for f in FAMILIES)} "
                        "(e.g. gymnax:CartPole-v1, navix:Navix-DoorKey-Random-8x8-v0, xminigrid:MiniGrid-LockedRoom, "
                        "craftax:Craftax-Classic-Symbolic-v1, reflectrl:GridWorld-v0)")
