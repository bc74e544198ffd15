"""What each optional part needs beyond `pip install mqmeta`, and the one sentence a
command answers when it is missing.

The core install runs every server and client command. The audit, the chaos suite and
object-store URLs need packages that the extras `mqmeta[audit]`, `mqmeta[chaos]` and
`mqmeta[s3]` install (pyproject.toml lists the same packages). A command calls
`require_extra` before it imports them, so that a missing package is one sentence and
exit 2, never a ModuleNotFoundError's traceback.
"""

from __future__ import annotations

import importlib.util

from mqmeta.errors import FailedPrecondition

# Per extra: (import name, the name a user knows the package by), in the order checked.
_AUDIT = (("pyspark", "PySpark"), ("pyarrow", "PyArrow"), ("pandas", "pandas"), ("matplotlib", "matplotlib"))
EXTRA_MODULES: dict[str, tuple[tuple[str, str], ...]] = {
    "audit": _AUDIT,
    # a chaos run is audited, draws latency plots, drives the fault proxies through the
    # Toxiproxy client, serves their API on aiohttp, may drive the RocketMQ 5 client, and
    # mounts the fault filesystem
    "chaos": (
        ("toxiproxy", "toxiproxy-python"),
        ("aiohttp", "aiohttp"),
        ("rocketmq", "rocketmq-python-client"),
        ("mfusepy", "mfusepy"),  # the fault filesystem (chaos/faultfs)
        *_AUDIT,
    ),
    "s3": (("s3fs", "s3fs"),),
    # bench/peers drives RabbitMQ and NATS with their own clients
    "peers": (("pika", "pika"), ("nats", "nats-py")),
}


class MissingExtra(FailedPrecondition):
    """A command needs a package of an extra that is not installed."""

    default_code = "MISSING_EXTRA"


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a blocked or half-imported module
        return False


def missing_package(extra: str) -> str | None:
    """The first package of `extra` that is not installed (its user-facing name), or None."""
    for module, package in EXTRA_MODULES[extra]:
        if not _installed(module):
            return package
    return None


def require_extra(extra: str, what: str) -> None:
    """MissingExtra naming the extra when one of its packages is not installed.
    `what` is the subject of the sentence: "the audit", "the chaos suite", "s3:// URLs"."""
    package = missing_package(extra)
    if package is not None:
        raise MissingExtra(f"{what} needs {package}: pip install 'mqmeta[{extra}]'")


S3_SCHEMES = ("s3", "s3a")  # the schemes s3fs serves


def require_for_url(url: str, what: str) -> None:
    """MissingExtra when `url` is an s3:// or s3a:// URL and s3fs is not installed;
    `what` names the URL's role ("tiered storage", "audit input")."""
    scheme, separator, _ = url.partition("://")
    if separator and scheme.lower() in S3_SCHEMES:
        require_extra("s3", f"{what} at {scheme.lower()}://")
