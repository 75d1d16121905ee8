"""The reference fleet application: the jobs the demo fleet runs.

``worker.app`` exposes ``registry`` (and ``crons``); the container image runs it
with ``pgfleet worker --app worker.app:registry``.
"""
