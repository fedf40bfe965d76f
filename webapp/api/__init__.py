"""The JSON API under /api/v1/ for scripts and notebooks (bearer tokens)."""
