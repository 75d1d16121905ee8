"""The pinned supply chain: lock files for every install path, and the check that
none of their pins has a known advisory.

``python -m tools.supply lock`` regenerates ``requirements/*.lock`` from
pyproject.toml with uv (hashes of every file of every pinned release, for any
platform); ``python -m tools.supply audit`` reports known-vulnerable pins;
``python -m tools.supply advisories`` refreshes the offline advisory snapshot the
audit falls back to when no advisory service answers. See
docs/operations/security.md, "Supply chain".
"""
