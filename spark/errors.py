"""The audit's own errors: bad input is a sentence for the user (exit 2), never a trace."""

from __future__ import annotations

from mqmeta.errors import InvalidArgument


class BadInput(InvalidArgument):
    """An INPUT is missing, unreadable or holds nothing to audit."""
