"""The pipeline engine: compiles an operator chain into stages and runs it with any runner.

Private to zephon: the public surface is ``zephon.Pipeline`` (iteration, ``explain()``,
``checkpoint()`` / ``restore()``, ``stats()``) and ``zephon.checkpoints``.

``stats.py`` counts a run; the rest is in one sub-package per part: ``plan`` (what runs
where), ``feed`` (the input stream), ``run`` (the engine, which runs a compiled run and
checkpoints it, the runners and the threads that drive operators), ``workers`` (thread,
process and Ray pools), ``state`` (the stage core, and what a restore starts from) and
``handoff`` (what crosses threads and processes). ``scripts/check_layering.py`` keeps their
order (``ENGINE_LAYERS``).
"""
