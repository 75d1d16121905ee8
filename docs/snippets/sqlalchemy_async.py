"""sqlalchemy_async.py: enqueue on a SQLAlchemy AsyncSession, in its transaction.

Run it with PGFLEET_DATABASE_URL set (pgfleet migrated there); it prints what
committed and what rolled back."""

import asyncio
import os
from uuid import UUID

from sqlalchemy import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from pgfleet.contrib.sqlalchemy import AsyncProducer

producer = AsyncProducer()  # one per application


class Base(DeclarativeBase):
    pass


class Signup(Base):
    __tablename__ = "signups"
    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str]


class Refused(Exception):
    pass


async def sign_up(engine: AsyncEngine, email: str) -> UUID:
    """A signup and its welcome job, committed together (or neither)."""
    async with AsyncSession(engine) as session, session.begin():
        signup = Signup(email=email)
        session.add(signup)
        await session.flush()  # the signup's id
        job_id = await producer.enqueue(session, "send_welcome", {"signup": signup.id})
        if not email.endswith("@example.com"):
            raise Refused(job_id)  # the block rolls back: the job goes with the signup
    return job_id


async def main() -> None:
    # postgresql+asyncpg:// here; postgresql+psycopg:// works the same.
    url = make_url(os.environ["PGFLEET_DATABASE_URL"]).set(drivername="postgresql+asyncpg")
    engine = create_async_engine(url)
    try:
        async with engine.begin() as conn:
            await conn.run_sync(Base.metadata.create_all)
        committed = await sign_up(engine, "ada@example.com")
        try:
            await sign_up(engine, "mallory@elsewhere.test")
        except Refused as refused:
            rolled_back = refused.args[0]
        async with AsyncSession(engine) as session:
            job = await producer.get(session, committed)
            assert job is not None
            print(f"committed: {job.name} is {job.status.value}")
            print(f"rolled back: {await producer.get(session, rolled_back)}")  # None: no job
    finally:
        await engine.dispose()


if __name__ == "__main__":
    asyncio.run(main())
