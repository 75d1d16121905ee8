"""Access checks that need no server: credentials and their strength, roles, endpoint
declarations, trusted proxies, allowed hosts, the failure backoff and redaction."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pgfleet.service.credentials import (
    Access,
    Credential,
    CredentialError,
    Credentials,
    Role,
    access_of,
    digest,
    load,
    new_token,
    parse_entries,
    requires,
    secret_problem,
)
from pgfleet.service.guard import AllowedHosts, FailureBackoff, TrustedProxies, parse_networks
from pgfleet.service.redaction import MASK, Redactor, parse_fields

ROOT = Path(__file__).resolve().parents[3]
STRONG = "Zq8v-3nKp_Wt7yLm2Rb9xHc4"


def test_each_role_grants_what_it_says_and_nothing_more() -> None:
    assert Role.PRODUCER.grants == {Access.ENQUEUE, Access.READ_JOB}
    assert Role.VIEWER.grants == {Access.READ_JOB, Access.OBSERVE}
    assert Role.OPERATOR.grants == set(Access) - {Access.PUBLIC}
    for role in Role:
        assert role.allows(Access.PUBLIC)
    assert not Role.PRODUCER.allows(Access.OBSERVE)
    assert not Role.VIEWER.allows(Access.OPERATE) and not Role.VIEWER.allows(Access.PAYLOADS)


def test_entries_name_a_role_and_a_secret_and_keep_only_its_digest() -> None:
    token = new_token()
    creds = parse_entries(f"ci:producer:{token}, ops:operator:{STRONG}", "test")
    assert [(c.name, c.role) for c in creds] == [("ci", Role.PRODUCER), ("ops", Role.OPERATOR)]
    assert creds[0].digest == digest(token)
    assert token not in repr(creds)
    hashed = parse_entries(f"# a comment\nro:viewer:sha256:{digest(STRONG).hex()}\n", "file")
    assert hashed == [Credential("ro", Role.VIEWER, digest(STRONG))]


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("ci:producer", "name:role:secret"),
        (f"ci:admin:{STRONG}", "unknown role 'admin'"),
        (f"bad name:producer:{STRONG}", "credential name 'bad name'"),
        ("ci:producer:sha256:abc", "64 hex digits"),
        ("ci:producer:short", "fewer than 24"),
    ],
)
def test_malformed_entries_are_refused_naming_the_problem_never_the_secret(
    text: str, problem: str
) -> None:
    with pytest.raises(CredentialError, match=problem) as caught:
        parse_entries(text, "PGFLEET_API_CREDENTIALS")
    assert STRONG not in str(caught.value)


def test_the_example_files_placeholders_and_weak_secrets_are_refused() -> None:
    example = (ROOT / ".env.example").read_text()
    placeholders = [
        line.split("=", 1)[1]
        for line in example.splitlines()
        if "=" in line and not line.startswith("#") and "change-me" in line
    ]
    for value in [*placeholders, "change-me-api-token", "x", "a" * 40, "abababababababababababab"]:
        assert secret_problem(value) is not None, value
    assert secret_problem(new_token()) is None
    assert secret_problem(STRONG) is None


def test_the_legacy_token_is_one_operator_and_a_weak_one_is_refused() -> None:
    creds = load(legacy_token=f" {STRONG} ")
    assert creds.authenticate(STRONG) == Credential("api-token", Role.OPERATOR, digest(STRONG))
    with pytest.raises(CredentialError, match="too weak"):
        load(legacy_token="change-me-api-token")
    with pytest.raises(CredentialError, match="empty"):
        load(legacy_token=" ")


def test_names_and_secrets_are_unique_so_one_can_be_revoked_alone() -> None:
    with pytest.raises(CredentialError, match="defined twice"):
        Credentials([Credential("a", Role.VIEWER, digest("1")), Credential("a", Role.VIEWER)])
    with pytest.raises(CredentialError, match="same secret"):
        load(entries=f"a:viewer:{STRONG},b:operator:{STRONG}")


def test_authentication_finds_the_credential_of_a_secret_only() -> None:
    other = new_token()
    creds = load(entries=f"ci:producer:{STRONG},ops:operator:{other}")
    assert creds.authenticate(STRONG).name == "ci"  # type: ignore[union-attr]
    assert creds.authenticate(other).name == "ops"  # type: ignore[union-attr]
    assert creds.authenticate(STRONG[:-1]) is None
    assert creds.authenticate("") is None


def test_an_endpoint_without_a_declaration_cannot_be_routed() -> None:
    @requires(Access.OPERATE)
    async def declared(_request: Any) -> None: ...

    async def forgotten(_request: Any) -> None: ...

    assert access_of(declared) is Access.OPERATE
    with pytest.raises(LookupError, match="forgotten declares no access"):
        access_of(forgotten)


def test_forwarded_headers_count_only_from_trusted_proxies() -> None:
    proxies = TrustedProxies(parse_networks("10.0.0.0/8, ::1", "--trusted-proxies"))
    headers = {
        "X-Forwarded-For": "203.0.113.9, 198.51.100.7, 10.1.2.3",
        "X-Forwarded-Proto": "https",
        "X-Forwarded-Host": "jobs.example.com",
    }
    peer = proxies.peer("10.0.0.1", "http", "internal:8000", headers)
    # The right-most address no trusted hop added: 198.51.100.7 (its left is unverifiable).
    assert (peer.address, peer.scheme, peer.host) == ("198.51.100.7", "https", "jobs.example.com")
    assert peer.secure
    untrusted = proxies.peer("192.0.2.1", "http", "internal:8000", headers)
    assert (untrusted.address, untrusted.scheme, untrusted.host) == (
        "192.0.2.1",
        "http",
        "internal:8000",
    )
    with pytest.raises(ValueError, match="'nonsense' is not an IP"):
        parse_networks("nonsense", "--trusted-proxies")


def test_the_default_host_list_is_loopback_and_the_bound_address() -> None:
    hosts = AllowedHosts.parse(None, "127.0.0.1")
    for host in ("localhost:8000", "127.0.0.1", "[::1]:8000", "LOCALHOST"):
        assert hosts.allows(host), host
    for bad in ("evil.example", "evil.example:8000", "", None, "127.0.0.1.evil.example"):
        assert not hosts.allows(bad), bad
    assert AllowedHosts.parse("jobs.internal", "0.0.0.0").allows("jobs.internal:8000")
    assert AllowedHosts.parse("*", "0.0.0.0").allows("anything")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_failures_past_the_free_ones_pause_that_client_for_longer_each_time() -> None:
    clock = Clock()
    backoff = FailureBackoff(free=3, base=1, cap=8, forget=100, clock=clock)
    assert [backoff.failed("a") for _ in range(3)] == [0, 0, 0]
    assert backoff.retry_after("a") == 0
    assert [backoff.failed("a") for _ in range(5)] == [1, 2, 4, 8, 8]
    assert backoff.retry_after("a") == 8
    assert backoff.retry_after("b") == 0  # another client is not slowed
    clock.now += 8
    assert backoff.retry_after("a") == 0
    backoff.succeeded("a")
    assert backoff.failures("a") == 0
    backoff.failed("b")
    clock.now += 101
    assert backoff.retry_after("b") == 0 and backoff.failures("b") == 0


def test_the_backoff_table_keeps_a_bounded_number_of_clients() -> None:
    backoff = FailureBackoff(max_clients=3)
    for client in "abcde":
        backoff.failed(client)
    assert [backoff.failures(c) for c in "abcde"] == [0, 0, 1, 1, 1]


def test_redaction_masks_fields_in_payloads_and_errors() -> None:
    redactor = Redactor(parse_fields("password, card_number"))
    payload = {"user": "a", "Password": "hunter2", "items": [{"card_number": "4242"}]}
    assert redactor.payload("x", payload) == {
        "user": "a",
        "Password": MASK,
        "items": [{"card_number": MASK}],
    }
    error = "login failed: password=hunter2 for a; body {'card_number': '4242', 'n': 1}"
    shown = redactor.error("x", error)
    assert shown is not None and "hunter2" not in shown and "4242" not in shown
    assert "'n': 1" in shown
    assert parse_fields(None) and parse_fields("none") == ()


def test_a_redaction_hook_runs_after_the_fields() -> None:
    class Hook:
        def payload(self, name: str, payload: Any) -> Any:
            return {"name": name, "keys": sorted(payload)}

        def error(self, name: str, text: str) -> str:
            return text.replace("SECRET", "***")

    redactor = Redactor(("token",), Hook())
    assert redactor.payload("j", {"token": "t", "a": 1}) == {"name": "j", "keys": ["a", "token"]}
    assert redactor.error("j", "SECRET token=abc") == f"*** token={MASK}"
    assert Redactor((), lambda name, p: "hidden").payload("j", {"a": 1}) == "hidden"
    with pytest.raises(TypeError, match="redact-hook"):
        Redactor((), 42)


def test_job_name_labels_are_bounded_and_known_names_always_fit() -> None:
    from pgfleet.service.metrics import OTHER, NameLabels

    labels = NameLabels(2, known=("mine",))
    assert [labels(n) for n in ("a", "mine", "b", "c", "a", "mine")] == [
        "a",
        "mine",
        "b",
        OTHER,
        "a",
        "mine",
    ]
    assert labels.overflowed
    unbounded = NameLabels(0)
    assert all(unbounded(str(i)) == str(i) for i in range(500))


def test_a_database_url_with_the_example_password_is_refused() -> None:
    from pgfleet.service.process import dsn_problem

    problem = dsn_problem("postgresql://pgfleet:change-me-postgres-password@db/pgfleet")
    assert problem is not None and "placeholder" in problem
    assert "change-me-postgres-password" not in problem
    assert dsn_problem("postgresql://pgfleet:Xq3-real-9w@db/pgfleet") is None
