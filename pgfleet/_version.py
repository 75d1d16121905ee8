"""The package version: one place, imported by the package and its runtime."""

__version__ = "0.2.0"
