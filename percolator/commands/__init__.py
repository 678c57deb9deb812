"""Engine-level sub-commands of the ``percolator`` command line (one module each)."""
