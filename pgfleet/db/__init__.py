"""The SQL layer: every query pgfleet sends lives in this package."""

from pgfleet.db.queries import Q, Query

#: The one notification channel; notifications carry an empty payload.
CHANNEL = "pgfleet_jobs"

__all__ = ["CHANNEL", "Q", "Query"]
