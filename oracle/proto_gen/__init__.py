"""Generated from proto/oracle.proto by `python -m percolator.oracle.gen`; do not edit."""
