"""The package's version, in the lowest layer: what a run's status and a report's provenance record
(reflectrl/__init__.py exports it as reflectrl.__version__)."""

__version__ = "0.1.0"
