"""``python -m tools.bench``: the benchmark suites (see tools/bench/suite.py)."""

from tools.bench.suite import cli

cli()
