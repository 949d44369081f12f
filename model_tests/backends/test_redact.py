"""A PostgreSQL URL's secrets are never shown: ``store.path`` and every message
that names the store show the URL without them, in each form libpq accepts a
password (``user:pw@``, a ``password`` or ``sslpassword`` query parameter, a
``password=`` keyword, quoted or not), and the rest of the URL as given (an
IPv6 host keeps its brackets, so the shown URL still names the server).

No server needed: the CLI's connection is refused by a closed port."""

from __future__ import annotations

import subprocess
import sys

import pytest

from turnkeeper.storage.postgres.connect import redact

SECRET = "s3cr3t"

SHOWN = [
    ("postgresql://tk:s3cr3t@h:5432/db", "postgresql://tk:***@h:5432/db"),
    ("postgresql://tk:s3cr3t@[::1]:5432/db", "postgresql://tk:***@[::1]:5432/db"),
    ("postgres://tk:s3cr3t@h1:5432,h2:5433/db", "postgres://tk:***@h1:5432,h2:5433/db"),
    ("postgresql://tk@h/db?password=s3cr3t", "postgresql://tk@h/db?password=***"),
    (
        "postgresql://tk@h/db?sslmode=require&sslpassword=s3cr3t&connect_timeout=3",
        "postgresql://tk@h/db?sslmode=require&sslpassword=***&connect_timeout=3",
    ),
    ("postgresql://tk@h/db?pass%77ord=s3cr3t", "postgresql://tk@h/db?pass%77ord=***"),
    ("postgresql://h/db", "postgresql://h/db"),
    ("host=h password=s3cr3t dbname=db", "host=h password=*** dbname=db"),
    ("host=h password='my s3cr3t pw' dbname=db", "host=h password=*** dbname=db"),
    ("host=h password = 'it\\'s s3cr3t' dbname=db", "host=h password=*** dbname=db"),
    ("host=h sslpassword=s3cr3t", "host=h sslpassword=***"),
    ("host=h password='unterminated s3cr3t", "host=h password=***"),
    ("host=h dbname=db", "host=h dbname=db"),
]


@pytest.mark.parametrize(("url", "shown"), SHOWN)
def test_a_urls_secrets_are_not_shown(url: str, shown: str) -> None:
    assert redact(url) == shown


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://tk@127.0.0.1:1/db?password=s3cr3t",
        "host=127.0.0.1 port=1 user=tk password='my s3cr3t pw' dbname=db",
        "postgresql://tk@127.0.0.1:1/db?sslpassword=s3cr3t",
        "postgresql://tk:s3cr3t@127.0.0.1:1/db",
    ],
)
def test_a_refused_connection_does_not_show_the_password(url: str) -> None:
    """What a user sees when the server is not there: the CLI's error names the
    store, without the password."""
    done = subprocess.run(
        [sys.executable, "-m", "turnkeeper.cli.main", "report", "--db", url],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "cannot connect" in done.stderr, done.stderr
    assert SECRET not in done.stdout + done.stderr, done.stderr


def test_a_listen_url_disagreement_does_not_show_the_passwords() -> None:
    """The URL's listen_url and the argument's disagree: the error shows both, without
    their passwords (no connection is made)."""
    import turnkeeper

    in_url = "postgresql%3A%2F%2Ftk%3As3cr3t%40h%2Fdb"
    with pytest.raises(turnkeeper.InvalidInputError) as err:
        turnkeeper.open_store(
            f"postgresql://tk@h/db?listen_url={in_url}", listen_url="host=h password=s3cr3t"
        )
    assert err.value.field == "listen_url"
    assert SECRET not in str(err.value) and "***" in str(err.value), str(err.value)
