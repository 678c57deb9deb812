"""Generated from proto/oracle.proto by `python -m oracle.gen`; do not edit."""
