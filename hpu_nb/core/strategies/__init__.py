"""Lightning strategies for Gaudi."""
