"""The benchmark suite: ``python bench/run.py`` (see README.md)."""
