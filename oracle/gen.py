"""Regenerate (or check) the gRPC code in ``oracle/proto_gen/`` from ``proto/oracle.proto``.

This is the one way the generated code is produced::

    python -m percolator.oracle.gen          # rewrite oracle/proto_gen/
    python -m percolator.oracle.gen --check  # exit 1 if oracle/proto_gen/ is not a fresh generation

The output depends on the code generators' versions, so both are pinned below and checked
before anything is generated.  The ``.proto`` is copied into a scratch tree at
``oracle/proto_gen/oracle.proto`` before ``protoc`` runs, so the generated modules import each
other as ``percolator.oracle.proto_gen.oracle_pb2``
(protoc derives import paths from the proto's path).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import shutil
import sys
import tempfile
from pathlib import Path

GRPCIO_TOOLS_VERSION = "1.85.1"
MYPY_PROTOBUF_VERSION = "5.1.0"

ROOT = Path(__file__).resolve().parent.parent
PROTO_SOURCE = ROOT / "proto" / "oracle.proto"
OUTPUT_DIR = ROOT / "oracle" / "proto_gen"
PACKAGE_PATH = Path("percolator") / "oracle" / "proto_gen"

INIT_TEXT = (
    '"""Generated from proto/oracle.proto by `python -m percolator.oracle.gen`; do not edit."""\n'
)


class GenerationError(Exception):
    """The generators are missing, have the wrong version, or protoc failed."""


def _check_versions() -> None:
    for dist, wanted in (
        ("grpcio-tools", GRPCIO_TOOLS_VERSION),
        ("mypy-protobuf", MYPY_PROTOBUF_VERSION),
    ):
        try:
            found = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            raise GenerationError(
                f"{dist}=={wanted} is needed to generate oracle/proto_gen/ and is not installed "
                "(install the project's dev extra)"
            ) from None
        if found != wanted:
            raise GenerationError(
                f"{dist}=={wanted} is needed to generate oracle/proto_gen/, found {found}: "
                "generated code differs between versions"
            )


def _plugin(name: str) -> str:
    # The mypy-protobuf plugins are console scripts installed beside this interpreter.
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    found = shutil.which(name)
    if found is None:
        raise GenerationError(f"protoc plugin {name!r} not found (is mypy-protobuf installed?)")
    return found


def generate(out_dir: Path) -> list[Path]:
    """Generate the package's files into ``out_dir``; returns the written files, sorted."""
    _check_versions()
    # Imported late: only generation needs grpcio-tools (which ships no type hints).
    from grpc_tools import protoc  # type: ignore[import-untyped]

    with tempfile.TemporaryDirectory() as scratch:
        src_root = Path(scratch) / "src"
        gen_root = Path(scratch) / "gen"
        (src_root / PACKAGE_PATH).mkdir(parents=True)
        (gen_root).mkdir()
        shutil.copyfile(PROTO_SOURCE, src_root / PACKAGE_PATH / "oracle.proto")
        proto_include = Path(protoc.__file__).parent / "_proto"
        args = [
            "protoc",
            f"-I{src_root}",
            f"-I{proto_include}",
            f"--plugin=protoc-gen-mypy={_plugin('protoc-gen-mypy')}",
            f"--plugin=protoc-gen-mypy_grpc={_plugin('protoc-gen-mypy_grpc')}",
            f"--python_out={gen_root}",
            f"--grpc_python_out={gen_root}",
            f"--mypy_out={gen_root}",
            f"--mypy_grpc_out={gen_root}",
            str(PACKAGE_PATH / "oracle.proto"),
        ]
        if protoc.main(args) != 0:
            raise GenerationError(f"protoc failed on {PROTO_SOURCE}")
        out_dir.mkdir(parents=True, exist_ok=True)
        written = []
        for produced in sorted((gen_root / PACKAGE_PATH).iterdir()):
            target = out_dir / produced.name
            shutil.copyfile(produced, target)
            written.append(target)
        init = out_dir / "__init__.py"
        init.write_text(INIT_TEXT)
        written.append(init)
        return sorted(written)


def check() -> list[str]:
    """Differences between ``oracle/proto_gen/`` and a fresh generation (empty: identical)."""
    problems: list[str] = []
    with tempfile.TemporaryDirectory() as scratch:
        fresh = {p.name: p.read_bytes() for p in generate(Path(scratch))}
    committed = (
        {
            p.name: p.read_bytes()
            for p in OUTPUT_DIR.iterdir()
            if p.is_file() and p.suffix in (".py", ".pyi")
        }
        if OUTPUT_DIR.is_dir()
        else {}
    )
    for name in sorted(set(fresh) | set(committed)):
        if name not in committed:
            problems.append(f"oracle/proto_gen/{name} is missing")
        elif name not in fresh:
            problems.append(f"oracle/proto_gen/{name} is not produced from proto/oracle.proto")
        elif fresh[name] != committed[name]:
            problems.append(f"oracle/proto_gen/{name} differs from proto/oracle.proto's output")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m percolator.oracle.gen",
        description="Generate oracle/proto_gen/ from proto/.",
    )
    parser.add_argument(
        "--check", action="store_true", help="compare instead of writing; exit 1 on a difference"
    )
    args = parser.parse_args(argv)
    try:
        if args.check:
            problems = check()
            for line in problems:
                print(f"percolator.oracle.gen: {line}", file=sys.stderr)
            if problems:
                print(
                    "percolator.oracle.gen: run `python -m percolator.oracle.gen` to regenerate",
                    file=sys.stderr,
                )
                return 1
            print("percolator.oracle.gen: oracle/proto_gen/ matches proto/oracle.proto")
            return 0
        for path in generate(OUTPUT_DIR):
            print(f"percolator.oracle.gen: wrote {path.relative_to(ROOT)}")
        return 0
    except GenerationError as exc:
        print(f"percolator.oracle.gen: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
