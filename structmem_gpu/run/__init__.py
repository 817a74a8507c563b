"""Running jobs: the stage pipeline, merging shards, the multirun summary."""
