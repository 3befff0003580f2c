"""Worker pools that run operators off the driver thread: threads, a fleet of worker processes
(their start, their loop, idle reuse, deadlines, OOM diagnosis) and Ray actors."""
