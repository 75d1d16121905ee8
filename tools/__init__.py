"""Developer tools that run pgfleet's processes: ``python -m tools.fleet`` (``make fleet``)."""
