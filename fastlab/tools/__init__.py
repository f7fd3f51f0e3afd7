"""Tooling around the workbook, apart from the library a learner reads: installing the notebooks, their timings
and the dashboard's kernel manager. The maintainers' GPU instruments (gpu-check, gpu-notebooks, the reference run)
live in tests/."""
