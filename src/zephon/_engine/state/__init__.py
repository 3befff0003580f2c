"""What a run restores from: lane states of accumulators, aligned snapshots and the rebuilt
records, the replay filter after a restore, and the counts a checkpoint carries."""
