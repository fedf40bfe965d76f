"""A run from its form to its end: config, queue, execution on a worker, the sink that records what
the trainer reports, live streaming to the run page, and the run's pages.
"""
