"""Bridges from reflectrl's signals to other libraries' trainers.

Each submodule imports its library at the top (they are optional extras), so import the
submodule itself, e.g. `from reflectrl.integrations.trl import GEARGRPOTrainer`
(`pip install 'reflectrl[trl]'`); `import reflectrl` never imports them.
"""
