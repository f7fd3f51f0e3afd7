"""Tooling around the workbook, apart from the library a learner reads: installing the notebooks, their timings,
the dashboard's kernel manager, the GPU check and the reference run."""
