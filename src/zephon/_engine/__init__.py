"""The pipeline engine: compiles an operator chain into stages and runs it with any runner.

Private to zephon: the public surface is ``zephon.Pipeline`` (iteration, ``explain()``,
``checkpoint()`` / ``restore()``, ``stats()``) and ``zephon.checkpoints``.

``engine.py`` runs a compiled run and checkpoints it; ``stats.py`` counts it. The rest is in
one sub-package per part: ``plan`` (what runs where), ``feed`` (the input stream), ``run``
(runners and the threads that drive operators), ``workers`` (thread, process and Ray pools),
``state`` (what a restore starts from) and ``handoff`` (what crosses threads and processes).
"""
