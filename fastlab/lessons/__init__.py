"""One module per technique notebook: the comparisons it runs and the demos only it needs.

A lesson imports the core modules, never another lesson (tests/test_structure.py reads the imports). Its
comparisons are plain functions the notebook calls; tests/reference_run.py lists the ones it repeats on a GPU
and fastlab.claim_map the judges it applies to their bundled results.
"""
