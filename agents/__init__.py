"""What agents are and the worlds they act in: environments, verifiers and the sandbox.

This package never imports Django or torch-heavy training code; `training/` builds on it.
"""
