"""The package's version, apart from fastlab/__init__ so that a module can read it without importing the
package's whole API (results.save_results writes it into every results file)."""

__version__ = "0.1.0"  # keep equal to pyproject.toml's version
