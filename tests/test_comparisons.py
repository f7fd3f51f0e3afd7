import pytest

import fastlab
from fastlab.comparisons import REGISTRY, all_comparisons, comparison, run_comparison


def test_registered_comparisons_run_and_are_tagged(quick):
    @comparison("99_test:batch")
    def batch(base, progress=True):
        return fastlab.sweep("batch_size", [8, 16], base=base, progress=progress)

    try:
        results = run_comparison("99_test:batch", quick, progress=False)
        assert [r.extras["comparison"] for r in results] == ["99_test:batch"] * 2
        assert "99_test:batch" in all_comparisons()
    finally:
        REGISTRY.pop("99_test:batch")
    with pytest.raises(ValueError, match="unknown comparison"):
        run_comparison("99_test:nothing", quick)
    with pytest.raises(ValueError, match="NN_notebook:what"):
        comparison("noname")
