"""What the tests share: models, environments, notebook runs, stand-ins."""
