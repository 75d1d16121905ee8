"""The request's psycopg connection and the shop's tables."""

from typing import Any

import psycopg
from flask import current_app, g

# The shop's own tables (a real app would keep them in its migrations).
SCHEMA = """
CREATE TABLE IF NOT EXISTS stock (
    sku       text PRIMARY KEY,
    available integer NOT NULL CHECK (available >= 0)
);
CREATE TABLE IF NOT EXISTS orders (
    id            bigserial PRIMARY KEY,
    email         text NOT NULL,
    sku           text NOT NULL REFERENCES stock,
    quantity      integer NOT NULL,
    receipt_job   uuid,
    receipts_sent integer NOT NULL DEFAULT 0
);
INSERT INTO stock VALUES ('mug', 10) ON CONFLICT DO NOTHING;
"""


def connection() -> psycopg.Connection[Any]:
    """The request's connection, opened on first use (use a pool in production:
    psycopg_pool). Autocommit: each `with conn.transaction()` is one transaction."""
    if "db" not in g:
        g.db = psycopg.connect(current_app.config["DATABASE_URL"], autocommit=True)
    conn: psycopg.Connection[Any] = g.db
    return conn


def close(error: BaseException | None = None) -> None:
    conn = g.pop("db", None)
    if conn is not None:
        conn.close()


def init(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(SCHEMA)
