"""Teams and their members: the current team of a request, API tokens, a member's own pages."""
