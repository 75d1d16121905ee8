"""Loads ``access.sql``: revoked credentials and console sessions, checked like
``queries.sql``."""

from __future__ import annotations

from pgfleet.db.queries import Query, QueryFile

#: Announces a change of pgfleet.revoked_credentials (empty payload).
CREDENTIALS_CHANNEL = "pgfleet_credentials"


class AccessQueries(QueryFile):
    """Attribute access to the access queries; one attribute per named block."""

    FILE = "access.sql"

    revocation_list: Query
    revocation_check: Query
    revocation_add: Query
    revocation_remove: Query
    session_create: Query
    session_touch: Query
    session_notice_set: Query
    session_delete: Query
    session_count_by_credential: Query


AQ = AccessQueries.load()
