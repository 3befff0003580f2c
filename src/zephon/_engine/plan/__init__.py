"""How a pipeline becomes a run: its stages, who runs each operator and how wide, fusion,
payload projection, driver chains, and the compiled run."""
