"""The toy's resolve: discrete actions only."""

from reflectrl.errors import UserError
from reflectrl.trainers.resolve import probe_env


def resolve(cfg):
    if probe_env(cfg).continuous:
        raise UserError("--algo toy needs discrete actions")
    return cfg
