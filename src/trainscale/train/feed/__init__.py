"""The run's input side: loaders over this rank's shard, a user's own batch sources, the loop's batches."""
