"""The pipeline engine: compiles an operator chain into stages and runs it with any runner.

Private to zephon: the public surface is ``zephon.Pipeline`` (iteration, ``explain()``,
``checkpoint()`` / ``restore()``, ``stats()``) and ``zephon.checkpoints``.
"""
