"""The version of durable, in one place: setuptools reads it for the package's metadata."""

__version__ = "0.1.0"
