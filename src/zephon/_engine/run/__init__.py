"""How a run is driven: the runner registry, the stage core every runner shares, the threads
that drive operators, the engine process, and the bounded waits and joins around them."""
