"""Experiments in the web app: a base config, axes and seeds whose trials are ordinary runs."""
