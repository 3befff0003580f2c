"""Built-in operators, one per module."""
