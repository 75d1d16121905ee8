"""Orders through psycopg: the pgfleet Producer writes the receipt job on the
request's connection, inside the order's transaction."""

from datetime import timedelta
from typing import Any

import psycopg
from flask import Blueprint, abort, request

from flask_shop.db import connection

# --8<-- [start:producer]
from pgfleet import EnqueueOptions
from pgfleet.contrib.psycopg import Producer

producer = Producer()  # one per application; thread-safe

# --8<-- [end:producer]
bp = Blueprint("orders", __name__)


@bp.post("/orders")
def place_order() -> tuple[dict[str, Any], int]:
    body = request.get_json()
    conn = connection()
    try:
        # --8<-- [start:place_order]
        with conn.transaction():
            order_id = conn.execute(
                "INSERT INTO orders (email, sku, quantity) VALUES (%s, %s, %s) RETURNING id",
                (body["email"], body["sku"], body["quantity"]),
            ).fetchall()[0][0]  # RETURNING gives one row
            # Written in this transaction: it commits or rolls back with the order.
            job_id = producer.enqueue(conn, "send_receipt", {"order": order_id})
            producer.enqueue(
                conn,
                "ask_for_review",
                {"order": order_id},
                options=EnqueueOptions(delay=timedelta(days=7), job_key=f"review:{order_id}"),
            )
            conn.execute("UPDATE orders SET receipt_job = %s WHERE id = %s", (job_id, order_id))
            # Too few left: the CHECK fails, and the order and its jobs roll back.
            conn.execute(
                "UPDATE stock SET available = available - %s WHERE sku = %s",
                (body["quantity"], body["sku"]),
            )
        # --8<-- [end:place_order]
    except psycopg.errors.CheckViolation:
        abort(409, f"not enough {body['sku']} in stock")
    except psycopg.errors.ForeignKeyViolation:
        abort(404, f"no product {body['sku']}")
    return {"order": order_id, "receipt_job": str(job_id)}, 201


@bp.get("/orders/<int:order_id>")
def get_order(order_id: int) -> dict[str, Any]:
    conn = connection()
    row = conn.execute(
        "SELECT receipt_job, receipts_sent FROM orders WHERE id = %s", (order_id,)
    ).fetchone()
    if row is None:
        abort(404, f"no order {order_id}")
    job = producer.get(conn, row[0])
    return {
        "order": order_id,
        "receipts_sent": row[1],
        "receipt_status": job.status.value if job is not None else None,
    }
