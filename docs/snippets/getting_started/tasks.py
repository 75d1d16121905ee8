"""tasks.py: the jobs your application can run, and the handlers that run them."""

from dataclasses import dataclass

import pgfleet

registry = pgfleet.Registry()


@dataclass
class SendEmail:
    to: str
    subject: str


@registry.job("send_email")
async def send_email(job: pgfleet.Job, payload: SendEmail) -> None:
    # A real handler would call a mail service here. A job can run more than once
    # (after a crash, say): make handlers safe to repeat.
    print(f"sending {payload.subject!r} to {payload.to} (attempt {job.attempt})")
