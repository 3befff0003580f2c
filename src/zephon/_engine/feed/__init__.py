"""The engine's input: the lanes' work sources turned into pointer records, and pointers into
rows."""
