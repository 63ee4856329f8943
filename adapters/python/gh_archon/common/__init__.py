"""Shared pieces of the gh_archon adapters."""
