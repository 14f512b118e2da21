"""What a run shows and records: log points (progress line, metrics.jsonl, trackers) and the summary builder."""
