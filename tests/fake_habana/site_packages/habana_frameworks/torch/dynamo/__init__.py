"""Fake habana_frameworks.torch.dynamo."""
