"""The Spark audit of every replicated log (issue P4)."""
