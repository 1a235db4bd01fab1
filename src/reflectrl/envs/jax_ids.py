"""The env ids of the JAX backend (reflectrl/envs/jax_envs.py builds them): FAMILY:NAME, checked
without importing JAX."""

from __future__ import annotations

from reflectrl.errors import UserError

# reflectrl: the built-in maze, reflectrl:GridWorld-v0
FAMILIES = ("gymnax", "navix", "xminigrid", "craftax", "reflectrl")

# gymnax pins gymnasium<1.4 (for its renderer only), so `reflectrl[jax]` cannot list it without
# holding every other env back: it goes in without its dependencies (jax, flax, matplotlib and
# seaborn, which the extra brings). scripts/setup.sh runs the same command.
JAX_INSTALL = "pip install 'reflectrl[jax]'"
GYMNAX_INSTALL = "pip install --no-deps 'gymnax>=1.0'"


def install_hint(env_id: str) -> str:
    """The command(s) that make a JAX env id's family importable."""
    if env_id.split(":", 1)[0] == "gymnax":
        return f"{JAX_INSTALL} && {GYMNAX_INSTALL}"
    return JAX_INSTALL


def is_jax_env(env_id: str) -> bool:
    return ":" in env_id and env_id.split(":", 1)[0] in FAMILIES


# The built-in maze has two spellings: Gymnasium's registry names it reflectrl/GridWorld-v0 (the torch
# backends), the JAX families reflectrl:GridWorld-v0. Each backend takes either and records its own.
GRID_WORLD = {"torch": "reflectrl/GridWorld-v0", "jax": "reflectrl:GridWorld-v0"}


def canonical_env_id(env_id: str, backend: str) -> str:
    """The id a run of `backend` records for --env: the grid world in that backend's spelling, any other id as it is."""
    if env_id in GRID_WORLD.values():
        return GRID_WORLD["jax" if backend == "jax" else "torch"]
    return env_id


# env.* knobs that the JAX backend's envs read themselves (envs/jax_envs.py): no torch env's constructor takes them
JAX_ENV_KNOBS = {
    "minigrid": "a knob of navix envs on the JAX backend (navix:<id> with --set backend=jax: MiniGrid's settings "
                "or navix's own); a MiniGrid id on the torch backend is MiniGrid itself: drop env.minigrid",
    "reset_ratio": "a knob of the JAX backend's envs (resets per step, --set backend=jax): drop env.reset_ratio "
                   "on the torch backend",
}


def check_jax_env_id(env_id: str, backend: str) -> None:
    """A JAX env id needs backend=jax, and backend=jax a JAX env id (the grid world in either spelling)."""
    env_id = canonical_env_id(env_id, backend)
    if is_jax_env(env_id) and backend != "jax":
        raise UserError(f"--env {env_id} is a JAX env: add --set backend=jax ({install_hint(env_id)})")
    if backend == "jax" and not is_jax_env(env_id):
        raise UserError(f"--env {env_id}: backend=jax takes {', '.join(f + ':<id>' for f in FAMILIES)} "
                        "(e.g. gymnax:CartPole-v1, navix:Navix-DoorKey-Random-8x8-v0, xminigrid:MiniGrid-LockedRoom, "
                        "craftax:Craftax-Classic-Symbolic-v1, reflectrl:GridWorld-v0)")
