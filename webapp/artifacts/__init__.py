"""A run's files on disk: checkpoints, exports and metric files, their downloads and deletion."""
