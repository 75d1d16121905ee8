"""``pgfleet credentials``: make, revoke and list the API's credentials.

``new NAME --role ROLE`` prints a fresh secret as a ``name:role:secret`` entry for
``PGFLEET_API_CREDENTIALS`` (and its ``sha256:`` form for files that must not hold
secrets); it needs no database. ``revoke NAME`` refuses a credential on every API
replica at once and ends its console sessions; ``restore NAME`` accepts it again;
``list`` shows the revoked names and the live console sessions. Exit codes: 0 done,
1 the database could not be used, 2 bad input.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from pgfleet.db.store import Store
from pgfleet.errors import PgfleetError
from pgfleet.queue import create_pool
from pgfleet.service.credentials import CredentialError, Role, check_name, digest, new_token
from pgfleet.service.flags import add_dsn
from pgfleet.service.process import NO_DATABASE, dsn_problem
from pgfleet.service.views import timestamp

EXIT_OK = 0
EXIT_DATABASE = 1
EXIT_USAGE = 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="credentials_command", required=True, metavar="ACTION")
    new = sub.add_parser("new", help="make a credential's secret (prints it once)")
    new.add_argument("name", help="the credential's name, as audit lines will show it")
    new.add_argument(
        "--role",
        required=True,
        choices=[r.value for r in Role],
        help="producer: enqueue and read a job by id; viewer: the console and lists, "
        "read-only; operator: everything",
    )
    common = argparse.ArgumentParser(add_help=False)
    add_dsn(common)
    revoke = sub.add_parser("revoke", parents=[common], help="refuse a credential everywhere, now")
    revoke.add_argument("name")
    revoke.add_argument("--reason", default="", help="why (kept with the revocation)")
    restore = sub.add_parser("restore", parents=[common], help="accept a revoked name again")
    restore.add_argument("name")
    listing = sub.add_parser(
        "list", parents=[common], help="revoked credentials and live console sessions"
    )
    listing.add_argument("--json", action="store_true", help="print JSON")


def main(args: argparse.Namespace) -> int:
    action = args.credentials_command
    try:
        if action == "new":
            name = check_name(args.name, "pgfleet credentials new")
            token = new_token()
            print(f"{name}:{args.role}:{token}")
            print(
                f"# the same without the secret, for a --credentials-file:\n"
                f"# {name}:{args.role}:sha256:{digest(token).hex()}",
                file=sys.stderr,
            )
            return EXIT_OK
        if not args.dsn:
            raise CredentialError(NO_DATABASE)
        problem = dsn_problem(args.dsn)
        if problem:
            raise CredentialError(problem)
        if action in ("revoke", "restore"):
            check_name(args.name, f"pgfleet credentials {action}")
        return asyncio.run(_run(args))
    except CredentialError as exc:
        print(f"pgfleet credentials {action}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except PgfleetError as exc:
        print(f"pgfleet credentials {action}: {exc}", file=sys.stderr)
        return EXIT_DATABASE


async def _run(args: argparse.Namespace) -> int:
    try:
        pool = await create_pool(args.dsn, min_size=1, max_size=1, timeout=10.0)
    except Exception as exc:  # refused, unknown host, bad password, no such database
        print(
            f"pgfleet credentials {args.credentials_command}: cannot connect to the "
            f"database: {exc or type(exc).__name__}",
            file=sys.stderr,
        )
        return EXIT_DATABASE
    store = Store(pool)
    try:
        if args.credentials_command == "revoke":
            added, ended = await store.revocation_add(name=args.name, reason=args.reason)
            state = "revoked" if added else "was already revoked"
            print(f"{args.name} {state}; {ended} console session(s) ended")
        elif args.credentials_command == "restore":
            removed = await store.revocation_remove(name=args.name)
            print(f"{args.name} accepted again" if removed else f"{args.name} was not revoked")
        else:
            await _list(store, args.json)
    finally:
        await pool.close()
    return EXIT_OK


async def _list(store: Store, as_json: bool) -> None:
    revoked = await store.revocation_list()
    sessions = await store.session_count_by_credential()
    if as_json:
        out: dict[str, Any] = {
            "revoked": [
                {"name": r.name, "revoked_at": timestamp(r.revoked_at), "reason": r.reason}
                for r in revoked
            ],
            "sessions": [
                {
                    "credential": s["credential"],
                    "sessions": s["sessions"],
                    "last_seen_at": timestamp(s["last_seen_at"]),
                }
                for s in sessions
            ],
        }
        print(json.dumps(out, indent=2))
        return
    print("revoked credentials:" if revoked else "no revoked credentials")
    for r in revoked:
        print(f"  {r.name:<24} {timestamp(r.revoked_at)}  {r.reason}")
    print("live console sessions:" if sessions else "no live console sessions")
    for s in sessions:
        seen = timestamp(s["last_seen_at"])
        print(f"  {s['credential']:<24} {s['sessions']:>4}  last seen {seen}")
