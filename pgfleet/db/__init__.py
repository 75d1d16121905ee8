"""The SQL layer: every query pgfleet sends lives in this package."""

from pgfleet.db.queries import Q, Query

#: Wakes workers: jobs to claim. Empty payloads (due now), or seconds since the
#: epoch when the jobs announced are scheduled for later.
CHANNEL = "pgfleet_jobs"
#: Tells the worker holding a running job that someone asked to cancel it
#: (payload: the job id).
CANCEL_CHANNEL = "pgfleet_cancel"
#: Finished jobs someone waits for (Queue.wait): comma-separated ids, or '' (look
#: them all up).
DONE_CHANNEL = "pgfleet_done"

__all__ = ["CANCEL_CHANNEL", "CHANNEL", "DONE_CHANNEL", "Q", "Query"]
