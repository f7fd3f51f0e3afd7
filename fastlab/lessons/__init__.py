"""One module per technique notebook: the comparisons it runs and the demos only it needs.

Every module here is imported by fastlab.comparisons.all_comparisons(), so a comparison
registered with @comparison("NN_notebook:name") is found by the GPU reference script too.
"""
