"""What crosses between threads and processes: the messages, shared memory for payloads, the
reorder buffer, the lane tail and the engine-process hand-off."""
