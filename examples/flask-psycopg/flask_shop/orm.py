"""The same orders through SQLAlchemy: the pgfleet Producer writes the receipt job
on the Session, inside its transaction."""

import uuid
from typing import Any

from flask import Blueprint, abort, current_app, request
from sqlalchemy import Engine, ForeignKey, make_url, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

# --8<-- [start:producer]
from pgfleet.contrib.sqlalchemy import Producer

producer = Producer()  # one per application; thread-safe

# --8<-- [end:producer]
bp = Blueprint("orm", __name__)


class Base(DeclarativeBase):
    pass


class Stock(Base):
    __tablename__ = "stock"
    sku: Mapped[str] = mapped_column(primary_key=True)
    available: Mapped[int]


class Order(Base):
    __tablename__ = "orders"
    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str]
    sku: Mapped[str] = mapped_column(ForeignKey("stock.sku"))
    quantity: Mapped[int]
    receipt_job: Mapped[uuid.UUID | None]
    receipts_sent: Mapped[int] = mapped_column(default=0)


def sqlalchemy_url(database_url: str) -> str:
    """postgresql://... as SQLAlchemy's psycopg 3 dialect (what the Producer needs)."""
    url = make_url(database_url).set(drivername="postgresql+psycopg")
    return url.render_as_string(hide_password=False)


@bp.post("/orders")
def place_order() -> tuple[dict[str, Any], int]:
    body = request.get_json()
    engine: Engine = current_app.extensions["engine"]
    try:
        # --8<-- [start:place_order]
        with Session(engine) as session, session.begin():
            order = Order(email=body["email"], sku=body["sku"], quantity=body["quantity"])
            session.add(order)
            session.flush()  # the order's id
            order_id = order.id
            # Written in the session's transaction: it commits or rolls back with it.
            job_id = producer.enqueue(session, "send_receipt", {"order": order_id})
            order.receipt_job = job_id
            session.execute(
                update(Stock)
                .where(Stock.sku == order.sku)
                .values(available=Stock.available - order.quantity)
            )
        # --8<-- [end:place_order]
    except IntegrityError:  # the stock's CHECK (too few left) or an unknown product
        abort(409, f"cannot order {body['quantity']} {body['sku']}")
    return {"order": order_id, "receipt_job": str(job_id)}, 201
