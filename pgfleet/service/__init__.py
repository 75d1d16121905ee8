"""The service side of pgfleet: worker processes, the HTTP jobs API, metrics.

Needs the ``pgfleet[service]`` extra (prometheus-client, uvloop).
"""
