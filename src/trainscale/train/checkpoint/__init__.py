"""Checkpoints: the files and their ``latest`` pointer, sharded DCP folders, the converter, the run's checkpointer."""
