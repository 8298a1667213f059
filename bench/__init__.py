"""The benchmark suite: ``python bench/run.py`` (see bench/README.md)."""
