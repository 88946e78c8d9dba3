"""Lightning integration for Gaudi: accelerator, strategies, precision, checkpoint IO, profiler."""
