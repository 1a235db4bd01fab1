"""The JAX backend (`--set backend=jax`): PPO and the signals compiled end to end and vectorised
over seeds (docs/jax.md). Importing this package imports no JAX; its modules do."""
