"""The team's shared experiment history: search, labels, compare and export."""
