"""The native fleet (``make fleet``): pgfleet's compose topology without Docker.

``python -m tools.fleet`` runs it until Ctrl-C. Tests and load tests drive the same
topology through :class:`NativeFleet`::

    fleet = NativeFleet(FleetConfig(database_url=dsn, ports=Ports(api=..., ...)))
    await fleet.start()          # every process answers its health check
    ...                          # fleet.api_url, fleet.prometheus_url, ...
    await fleet.stop_workers()   # and start_workers(): the rest keeps running
    await fleet.stop()           # drains; no process is left behind
"""

from tools.fleet.config import FleetConfig, Ports, prometheus_config, uses_checked_in_config
from tools.fleet.native import FleetError, NativeFleet
from tools.fleet.producer import DemoProducer, mixed_job

__all__ = [
    "DemoProducer",
    "FleetConfig",
    "FleetError",
    "NativeFleet",
    "Ports",
    "mixed_job",
    "prometheus_config",
    "uses_checked_in_config",
]
