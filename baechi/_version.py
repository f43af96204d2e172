"""The engine's version, in a module of its own so that any module may import it without
importing the package (``baechi/__init__`` imports :mod:`baechi.api`, which stamps plans)."""

__version__ = "0.1.0"
