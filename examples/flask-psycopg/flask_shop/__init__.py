"""A Flask shop on psycopg 3 (sync): an order and its receipt job commit together.

    flask --app flask_shop init-db
    flask --app flask_shop run                                          # and, beside it:
    pgfleet worker --app flask_shop.tasks:registry --dsn "$DATABASE_URL"

See README.md.
"""

import os

import click
from flask import Flask
from sqlalchemy import create_engine

from flask_shop import db, orders, orm


def create_app(database_url: str | None = None) -> Flask:
    app = Flask(__name__)
    app.config["DATABASE_URL"] = database_url or os.environ["DATABASE_URL"]
    # The SQLAlchemy variant's engine, on the same database through psycopg 3.
    app.extensions["engine"] = create_engine(orm.sqlalchemy_url(app.config["DATABASE_URL"]))
    app.teardown_appcontext(db.close)
    app.register_blueprint(orders.bp)
    app.register_blueprint(orm.bp, url_prefix="/orm")

    @app.cli.command("init-db")
    def init_db() -> None:
        """Create the shop's tables (pgfleet's schema: `pgfleet migrate`)."""
        db.init(app.config["DATABASE_URL"])
        click.echo("the shop's tables are ready")

    return app
