"""Operator sub-commands of the ``percolator`` command line that span the packages (``status``
reads the observers' and the oracle's state) or belong to no one package (``gc``).  One module
each, declared as ``percolator.commands`` entry points in pyproject.toml; this package is
part of the command-line layer, above the engine, the oracle, the observers and Spark jobs."""
