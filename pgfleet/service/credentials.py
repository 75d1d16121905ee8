"""Who may call the jobs API and open the console: named credentials with roles.

A credential is a name, a role and a secret (a bearer token, also the console's
password). Roles grant sets of :class:`Access`:

- ``producer``: enqueue jobs and read a job's status by its id (the id a 202 gave);
- ``viewer``: read-only operator: the console's pages and the API's job lists, no
  payloads, no changes;
- ``operator``: everything: changes (retry, cancel, fail, reschedule, bulk actions,
  force-unlock), payloads, and what producers and viewers may do.

Every endpoint declares the access it needs, once, with :func:`requires`; an
endpoint without a declaration refuses to be routed (see :func:`access_of`).

Credentials come from configuration (``PGFLEET_API_CREDENTIALS``,
``PGFLEET_API_CREDENTIALS_FILE``, or the one-token ``PGFLEET_API_TOKEN``, an
operator). Secrets are held only as SHA-256 digests and compared in constant
time; a weak secret or a documentation placeholder is refused at startup.

Standard library only: the parser of every ``pgfleet`` command reads this module.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import re
import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

#: Shortest secret accepted: 24 characters of a random token are over 140 bits.
MIN_SECRET_LENGTH = 24
#: Fewest distinct characters in a secret: refuses "aaaa…" and "abababab…".
MIN_DISTINCT = 10
#: Credential names: what audit lines and revocations name.
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@:-]{0,63}$")
#: Words of documentation placeholders and defaults, refused wherever they appear.
PLACEHOLDER_WORDS = (
    "change-me",
    "changeme",
    "change_me",
    "replace-me",
    "replaceme",
    "placeholder",
    "example",
    "your-token",
    "yourtoken",
    "secret-token",
    "s3cr3t",
    "password",
    "letmein",
    "xxxxxxxx",
)
#: The prefix of tokens made by ``pgfleet credentials new`` (secret scanners can
#: recognise it).
TOKEN_PREFIX = "pgf_"
#: The name the one-token setup's credential (``PGFLEET_API_TOKEN``) is audited under.
LEGACY_NAME = "api-token"


class Access(enum.Enum):
    """What an endpoint needs. Roles are sets of these."""

    #: Anyone, signed in or not: health probes, the login form, static files.
    PUBLIC = "public"
    #: POST /jobs.
    ENQUEUE = "enqueue"
    #: A job's status record, by its id.
    READ_JOB = "read_job"
    #: Lists and pages over every job, worker and schedule (the console included).
    OBSERVE = "observe"
    #: Job payloads.
    PAYLOADS = "payloads"
    #: Changes: retry, cancel, fail, reschedule, bulk actions, force-unlock.
    OPERATE = "operate"


class Role(enum.Enum):
    PRODUCER = "producer"
    VIEWER = "viewer"
    OPERATOR = "operator"

    @property
    def grants(self) -> frozenset[Access]:
        return ROLE_ACCESS[self]

    def allows(self, access: Access) -> bool:
        return access is Access.PUBLIC or access in ROLE_ACCESS[self]


ROLE_ACCESS: dict[Role, frozenset[Access]] = {
    Role.PRODUCER: frozenset({Access.ENQUEUE, Access.READ_JOB}),
    Role.VIEWER: frozenset({Access.READ_JOB, Access.OBSERVE}),
    Role.OPERATOR: frozenset(
        {Access.ENQUEUE, Access.READ_JOB, Access.OBSERVE, Access.PAYLOADS, Access.OPERATE}
    ),
}


class CredentialError(ValueError):
    """A credential that cannot be used: malformed, weak, a placeholder, a duplicate."""


@dataclass(frozen=True, slots=True)
class Credential:
    name: str
    role: Role
    #: SHA-256 of the secret.
    digest: bytes = b""

    @property
    def fingerprint(self) -> str:
        """A short public id of the secret (not enough to guess it): tells two
        secrets of one name apart in logs."""
        return self.digest.hex()[:8]


#: Who a request is, when authentication is off.
ANONYMOUS = Credential("anonymous", Role.OPERATOR)


def digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode("utf-8", "surrogateescape")).digest()


def new_token() -> str:
    """A fresh secret: 256 random bits, URL-safe."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def secret_problem(secret: str) -> str | None:
    """Why a secret is too weak to guard the API, or None."""
    lowered = secret.lower()
    for word in PLACEHOLDER_WORDS:
        if word in lowered:
            return f"it contains {word!r}: replace the example value with a generated token"
    if len(secret) < MIN_SECRET_LENGTH:
        return f"it has {len(secret)} characters, fewer than {MIN_SECRET_LENGTH}"
    if len(set(secret)) < MIN_DISTINCT:
        return f"it has only {len(set(secret))} distinct characters (at least {MIN_DISTINCT})"
    return None


def check_secret(secret: str, where: str) -> None:
    problem = secret_problem(secret)
    if problem is not None:
        raise CredentialError(
            f"{where}: the secret is too weak ({problem}); make one with "
            "`pgfleet credentials new NAME --role ROLE`"
        )


def parse_role(text: str, where: str) -> Role:
    try:
        return Role(text.strip().lower())
    except ValueError:
        roles = ", ".join(r.value for r in Role)
        raise CredentialError(f"{where}: unknown role {text!r}: use one of {roles}") from None


def check_name(name: str, where: str) -> str:
    if not NAME.match(name):
        raise CredentialError(
            f"{where}: credential name {name!r} must be 1-64 letters, digits or _ . @ : - "
            "(starting with a letter or digit)"
        )
    return name


def parse_entries(text: str, source: str) -> list[Credential]:
    """Credentials from ``name:role:secret`` entries separated by commas or new
    lines (``#`` starts a comment line). The secret may be ``sha256:<64 hex>``: the
    digest alone, for files that must not hold secrets (its strength cannot be
    checked, so make the secret with ``pgfleet credentials new``)."""
    found: list[Credential] = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("#"):
            continue
        for entry in line.split(","):
            entry = entry.strip()
            if not entry:
                continue
            where = f"{source} line {number}" if "\n" in text.strip() else source
            name, sep1, rest = entry.partition(":")
            role, sep2, secret = rest.partition(":")
            if not (sep1 and sep2 and secret):
                raise CredentialError(
                    f"{where}: an entry must look like name:role:secret, got {_masked(entry)!r}"
                )
            name = check_name(name.strip(), where)
            where = f"{where}, credential {name!r}"
            found.append(Credential(name, parse_role(role, where), _secret_digest(secret, where)))
    return found


def _secret_digest(secret: str, where: str) -> bytes:
    secret = secret.strip()
    if secret.startswith("sha256:"):
        hexdigest = secret[len("sha256:") :]
        if not re.fullmatch(r"[0-9a-fA-F]{64}", hexdigest):
            raise CredentialError(f"{where}: sha256: must be followed by 64 hex digits")
        return bytes.fromhex(hexdigest)
    check_secret(secret, where)
    return digest(secret)


def _masked(entry: str) -> str:
    """An entry as an error may show it: never the secret."""
    name, _, rest = entry.partition(":")
    role, sep, _secret = rest.partition(":")
    return f"{name}:{role}:…" if sep else f"{name}:…"


class Credentials:
    """The credentials one ``pgfleet api`` accepts."""

    def __init__(self, credentials: Iterable[Credential]) -> None:
        self.all: tuple[Credential, ...] = tuple(credentials)
        names: set[str] = set()
        digests: dict[bytes, str] = {}
        for cred in self.all:
            if cred.name in names:
                raise CredentialError(f"credential {cred.name!r} is defined twice")
            if cred.digest in digests:
                raise CredentialError(
                    f"credentials {digests[cred.digest]!r} and {cred.name!r} have the same "
                    "secret: give each its own, so that one can be revoked alone"
                )
            names.add(cred.name)
            digests[cred.digest] = cred.name
        self._by_name = {c.name: c for c in self.all}

    def __bool__(self) -> bool:
        return bool(self.all)

    def __len__(self) -> int:
        return len(self.all)

    def named(self, name: str) -> Credential | None:
        return self._by_name.get(name)

    def authenticate(self, secret: str) -> Credential | None:
        """The credential whose secret this is, or None. Every configured digest is
        compared, in constant time: the answer's timing says nothing of which one
        matched or how close a guess came."""
        given = digest(secret.strip())
        found = None
        for cred in self.all:
            if hmac.compare_digest(given, cred.digest):
                found = cred
        return found

    def roles(self) -> dict[Role, int]:
        counts = dict.fromkeys(Role, 0)
        for cred in self.all:
            counts[cred.role] += 1
        return counts


def load(
    *,
    entries: str | None = None,
    file: str | None = None,
    legacy_token: str | None = None,
) -> Credentials:
    """The credentials of ``--credentials``, ``--credentials-file`` and
    ``--auth-token`` together. Raises :class:`CredentialError` naming the problem."""
    found: list[Credential] = []
    if entries and entries.strip():
        found += parse_entries(entries, "--credentials (PGFLEET_API_CREDENTIALS)")
    if file:
        path = Path(file)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise CredentialError(
                f"--credentials-file {file}: cannot read it: {exc.strerror or exc}"
            ) from None
        found += parse_entries(text, f"--credentials-file {file}")
    if legacy_token is not None:
        token = legacy_token.strip()
        if not token:
            raise CredentialError("--auth-token is empty: give a token or leave it unset")
        check_secret(token, "--auth-token (PGFLEET_API_TOKEN)")
        found.append(Credential(LEGACY_NAME, Role.OPERATOR, digest(token)))
    return Credentials(found)


# ---------------------------------------------------------------- endpoint declarations

F = TypeVar("F", bound=Callable[..., Any])
_ATTRIBUTE = "__pgfleet_access__"


def requires(access: Access) -> Callable[[F], F]:
    """Declare what an endpoint's handler needs::

        @requires(Access.OPERATE)
        async def pause(self, request): ...

    The API and the console refuse to route a handler without a declaration."""

    def mark(handler: F) -> F:
        setattr(handler, _ATTRIBUTE, access)
        return handler

    return mark


def access_of(handler: Any) -> Access:
    """The declared access of a handler (bound methods included); raises
    ``LookupError`` for an undeclared one: an endpoint is never open by omission."""
    access = getattr(handler, _ATTRIBUTE, None)
    if not isinstance(access, Access):
        name = getattr(handler, "__qualname__", repr(handler))
        raise LookupError(
            f"{name} declares no access: decorate it with @requires(Access.…) "
            "(pgfleet/service/credentials.py)"
        )
    return access
