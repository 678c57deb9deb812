"""A real standalone HBase with its Thrift-1 and Thrift-2 gateways on this machine, from
Maven Central's jars and without Docker: for development (``percolator hbase start``) and
for the test suite.

See :mod:`percolator.testing.localhbase.launcher` and docs/hbase-local.md.
"""

from percolator.testing.localhbase.launcher import (
    HBaseLauncherError,
    HBaseStartError,
    HBaseStatus,
    JavaRuntime,
    LocalHBase,
    ensure_classpath,
    find_java,
    find_maven,
    hbase_version,
    probe,
    probe_tables_work,
    probe_thrift2,
    wait_until_serving,
)

__all__ = [
    "HBaseLauncherError",
    "HBaseStartError",
    "HBaseStatus",
    "JavaRuntime",
    "LocalHBase",
    "ensure_classpath",
    "find_java",
    "find_maven",
    "hbase_version",
    "probe",
    "probe_tables_work",
    "probe_thrift2",
    "wait_until_serving",
]
